"""The package version (one place; read by the CLI, build_info and pyproject via scikit-build-core)."""

__version__ = "0.1.0"
