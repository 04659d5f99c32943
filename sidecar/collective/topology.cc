// Placeholder until implemented (see topology.h).
#include "sidecar/collective/topology.h"
