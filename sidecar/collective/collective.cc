// Placeholder until implemented (see collective.h).
#include "sidecar/collective/collective.h"
