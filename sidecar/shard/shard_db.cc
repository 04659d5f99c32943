#include "sidecar/shard/shard_db.h"

#include <string>

namespace ts::sidecar {

state::DbOptions ShardDbOptions() {
  state::DbOptions options;
  options.tables = {std::string(kTableRounds), std::string(kTableRunSpecs)};
  options.schema_version = 1;
  return options;
}

}  // namespace ts::sidecar
