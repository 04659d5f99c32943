// The only code that includes RocksDB. A Db is a RocksDB database with named column families,
// a schema version key, synced atomic batches and prefix scans over plain strings. Typed tables
// (protobuf values) sit on top in ProtoTable.
//
// Every multi-key change goes through one WriteBatch written with sync = true, so a crash
// leaves either all of it or none of it on disk.
//
// Thread-safety: Db is thread-safe (RocksDB is); a WriteBatch has one owner.
#ifndef TS_STATE_DB_H_
#define TS_STATE_DB_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/message_lite.h"

namespace ts::state {

class Db;

// A set of puts and deletes applied atomically by Db::Write.
class WriteBatch {
 public:
  WriteBatch();
  ~WriteBatch();
  WriteBatch(WriteBatch&&) noexcept;
  WriteBatch& operator=(WriteBatch&&) noexcept;

  // `table` must name a column family the Db was opened with (checked by Db::Write).
  void Put(std::string_view table, std::string_view key, std::string_view value);
  void PutProto(std::string_view table, std::string_view key,
                const google::protobuf::MessageLite& value);
  void Delete(std::string_view table, std::string_view key);
  size_t size() const;

 private:
  friend class Db;
  struct Op {
    std::string table;
    std::string key;
    std::optional<std::string> value;
  };
  std::vector<Op> ops_;
};

struct DbOptions {
  // Column families besides "default". Opening creates missing ones.
  std::vector<std::string> tables;
  // Stored under key "schema_version" in "default". Opening a database with another version is
  // FAILED_PRECONDITION; a new database gets this one.
  uint32_t schema_version = 1;
  bool create_if_missing = true;
};

class Db {
 public:
  // Opens or creates the database in directory `path`. Errors: INVALID_ARGUMENT (bad table
  // names), FAILED_PRECONDITION (schema version mismatch), UNAVAILABLE (locked by another
  // process), INTERNAL (RocksDB I/O or corruption, with RocksDB's message).
  static absl::StatusOr<std::unique_ptr<Db>> Open(const std::string& path, DbOptions options);
  ~Db();

  // NOT_FOUND if absent.
  absl::StatusOr<std::string> Get(std::string_view table, std::string_view key) const;
  // NOT_FOUND if absent; DATA_LOSS if the stored bytes do not parse.
  absl::Status GetProto(std::string_view table, std::string_view key,
                        google::protobuf::MessageLite* value) const;

  // Applies the batch atomically; sync = true waits until it is durable.
  absl::Status Write(const WriteBatch& batch, bool sync = true);

  // Calls fn(key, value) for keys in [prefix...] in order, until fn returns false.
  absl::Status Scan(
      std::string_view table, std::string_view prefix,
      const std::function<bool(std::string_view key, std::string_view value)>& fn) const;
  // Like Scan, starting at `start` (inclusive), bounded by `prefix`.
  absl::Status ScanFrom(std::string_view table, std::string_view prefix, std::string_view start,
                        const std::function<bool(std::string_view, std::string_view)>& fn) const;

  const std::string& path() const;

 private:
  struct Impl;
  explicit Db(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Big-endian fixed-width key encodings, so keys sort numerically.
std::string EncodeU64Key(uint64_t v);
uint64_t DecodeU64Key(std::string_view key);  // first 8 bytes; TS_CHECKs size >= 8

}  // namespace ts::state

#endif  // TS_STATE_DB_H_
