// Placeholder until implemented (see tcp_transport.h).
#include "sidecar/collective/tcp_transport.h"
