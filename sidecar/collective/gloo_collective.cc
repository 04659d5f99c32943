// Placeholder until implemented (see gloo_collective.h).
#include "sidecar/collective/gloo_collective.h"
