// The `trainshard` command line as a function, so tests run it in-process with their own output
// streams and main() stays a one-liner. The command surface is documented in docs/cli.md.
//
// Thread-safety: one invocation per thread; `devnet start` blocks the calling thread until
// SIGTERM or SIGINT (which it blocks in the calling thread while it runs).
#ifndef TS_SIDECAR_CLI_CLI_H_
#define TS_SIDECAR_CLI_CLI_H_

#include <ostream>
#include <string>
#include <vector>

namespace ts::sidecar {

// Runs one command; `args` excludes the program name. Returns the exit code: 0 success, 1 the
// chain or a host refused, 2 bad usage or input, 3 the chain or a host cannot be reached.
// `err_is_terminal`: `err` is a terminal, so progress is drawn as a redrawn line (progress.h);
// otherwise it is written as plain lines.
int RunCli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err,
           bool err_is_terminal = false);

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_CLI_CLI_H_
