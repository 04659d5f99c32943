// Placeholder until implemented (see transport.h).
#include "sidecar/collective/transport.h"
