// trainshard: the command line of the trainshard network (docs/cli.md).
#include <unistd.h>

#include <iostream>
#include <string>
#include <vector>

#include "sidecar/cli/cli.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return ts::sidecar::RunCli(args, std::cout, std::cerr,
                             /*err_is_terminal=*/::isatty(STDERR_FILENO) == 1);
}
