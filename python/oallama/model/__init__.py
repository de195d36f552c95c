"""GGUF files: reading them (``gguf_file``) and making synthetic ones with real shapes,
tokenizers and type mixes (``synthetic``, from the architecture ``presets``): the project has no
model hub, so every test, demo and benchmark model comes from here."""
