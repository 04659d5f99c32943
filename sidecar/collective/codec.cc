// Placeholder until implemented (see codec.h).
#include "sidecar/collective/codec.h"
