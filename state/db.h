// The only code that includes RocksDB. A Db is a RocksDB database with named column families,
// a schema version key, synced atomic batches and prefix scans over plain strings. Typed tables
// (protobuf values) sit on top in ProtoTable.
//
// Every multi-key change goes through one WriteBatch written with sync = true, so a crash
// leaves either all of it or none of it on disk.
//
// A write that fails with an I/O error (a full disk above all) leaves RocksDB refusing every
// later write. The Db then recovers by itself: before a later write (at most once per
// DbOptions::recovery_interval_ms, and only once the filesystem has room for it) it closes the
// database and opens it again, and Health() says what is wrong meanwhile. Reads keep working
// while writes are refused; only while a reopen has failed (the database is closed) do they
// answer UNAVAILABLE. docs/host-sidecar.md ("Full disk") gives the reasons for reopening
// rather than RocksDB's own resume.
//
// Thread-safety: Db is thread-safe; a WriteBatch has one owner. A Scan callback must not call
// back into the same Db (a reopen waiting for the scan to end would deadlock it).
#ifndef TS_STATE_DB_H_
#define TS_STATE_DB_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
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

// A switch that makes every file write of a database fail with "No space left on device", and
// its filesystem report no free space, as a full disk does: for tests of what the code above a
// Db does then. Thread-safe.
class DiskFullFault {
 public:
  void Set(bool full) { full_.store(full); }
  bool full() const { return full_.load(); }

 private:
  std::atomic<bool> full_{false};
};

struct DbOptions {
  // Column families besides "default". Opening creates missing ones.
  std::vector<std::string> tables;
  // Stored under key "schema_version" in "default". Opening a database with another version is
  // FAILED_PRECONDITION; a new database gets this one.
  uint32_t schema_version = 1;
  bool create_if_missing = true;
  // After a write error, a reopen is tried at most this often...
  int64_t recovery_interval_ms = 1000;
  // ...and only when the filesystem has this many free bytes beyond the size of the write-ahead
  // logs (which opening replays into a table file).
  uint64_t recovery_free_bytes_min = 1 << 20;
  // Time for the two above and for DbHealth; the system clock when null. Not owned.
  common::Clock* clock = nullptr;
  // Tests only: makes the database's file writes fail as on a full filesystem. Null otherwise.
  std::shared_ptr<DiskFullFault> disk_full_fault;
};

// Whether a Db takes writes.
struct DbHealth {
  // OK while writes succeed. Otherwise the error that stopped them: RESOURCE_EXHAUSTED when the
  // filesystem is full, INTERNAL for other I/O errors, UNAVAILABLE while the database is closed
  // because a reopen failed. The message names the database's path.
  absl::Status error;
  // When `error` was first seen (unix ms); 0 while healthy.
  int64_t since_unix_ms = 0;
  // Reopens that cleared an error since Open.
  uint64_t recoveries = 0;
};

class Db {
 public:
  // Opens or creates the database in directory `path`. Errors: INVALID_ARGUMENT (bad table
  // names), FAILED_PRECONDITION (schema version mismatch), UNAVAILABLE (locked by another
  // process), RESOURCE_EXHAUSTED (the filesystem is full), INTERNAL (RocksDB I/O or corruption,
  // with RocksDB's message).
  static absl::StatusOr<std::unique_ptr<Db>> Open(const std::string& path, DbOptions options);
  ~Db();

  // NOT_FOUND if absent; UNAVAILABLE while the database is closed (a reopen failed).
  absl::StatusOr<std::string> Get(std::string_view table, std::string_view key) const;
  // NOT_FOUND if absent; DATA_LOSS if the stored bytes do not parse.
  absl::Status GetProto(std::string_view table, std::string_view key,
                        google::protobuf::MessageLite* value) const;

  // Applies the batch atomically; sync = true waits until it is durable. When the database is
  // refusing writes after an I/O error, first tries to recover (see the top of this file); a
  // write that fails with an I/O error is tried once more after a successful reopen. Errors:
  // INVALID_ARGUMENT (unknown table), RESOURCE_EXHAUSTED (the filesystem is full), UNAVAILABLE
  // (closed, a reopen failed), INTERNAL (other I/O errors). A batch that failed may still have
  // reached the log (a full record whose sync failed) and appear after a reopen; writing it again
  // is harmless, since a batch holds only puts and deletes.
  absl::Status Write(const WriteBatch& batch, bool sync = true);

  // Calls fn(key, value) for keys in [prefix...] in order, until fn returns false.
  absl::Status Scan(
      std::string_view table, std::string_view prefix,
      const std::function<bool(std::string_view key, std::string_view value)>& fn) const;
  // Like Scan, starting at `start` (inclusive), bounded by `prefix`.
  absl::Status ScanFrom(std::string_view table, std::string_view prefix, std::string_view start,
                        const std::function<bool(std::string_view, std::string_view)>& fn) const;

  const std::string& path() const;

  // Whether the database takes writes, and since when not. Cheap; does no I/O.
  DbHealth Health() const;

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
