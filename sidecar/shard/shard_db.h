// The shard process's database: its tables and their keys, in a header of their own so that
// whoever moves or reads a shard's records (the host sidecar migrating older records into a
// shard's own database, tools) needs nothing of the run itself.
//
//   rounds     be64(shard) be64(round) -> the round's certified record (training.proto)
//   run_specs  be64(shard)             -> the run spec document the shard runs
//
// Thread-safety: constants and a pure function.
#ifndef TS_SIDECAR_SHARD_SHARD_DB_H_
#define TS_SIDECAR_SHARD_SHARD_DB_H_

#include <string_view>

#include "state/db.h"

namespace ts::sidecar {

inline constexpr std::string_view kTableRounds = "rounds";       // be64(shard) be64(round)
inline constexpr std::string_view kTableRunSpecs = "run_specs";  // be64(shard) -> document

// The shard process's database (<shards_dir>/<shard_id>/state): kTableRounds and kTableRunSpecs.
state::DbOptions ShardDbOptions();

}  // namespace ts::sidecar

#endif  // TS_SIDECAR_SHARD_SHARD_DB_H_
