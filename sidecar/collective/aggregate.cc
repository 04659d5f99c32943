// Placeholder until implemented (see aggregate.h).
#include "sidecar/collective/aggregate.h"
