// oallama_poll_source: a pending check handed from one native module to another in a PyCapsule
// named "oallama.poll_source" (oallama._weaver's Ring.poll_source() -> oallama._core.PollHook).
// Plain C layout, no dependencies, so both modules agree on it.

#pragma once

struct oallama_poll_source {
    bool (*pending)(void * data) = nullptr;  // called at every polling point: keep it cheap
    void * data = nullptr;
};

#define OALLAMA_POLL_SOURCE_CAPSULE "oallama.poll_source"
