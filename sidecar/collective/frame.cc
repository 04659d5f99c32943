// Placeholder until implemented (see frame.h).
#include "sidecar/collective/frame.h"
