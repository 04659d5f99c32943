#include "chain-bridge/devnet/store.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/crypto/hash.h"
#include "common/regular_file.h"
#include "common/status.h"
#include "proto/deterministic.h"

namespace ts::bridge::devnet {
namespace {

absl::Status Errno(std::string_view what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat(absl::string_view(what.data(), what.size()), " ", path, ": ", strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<state::Db>> OpenStore(const std::string& home,
                                                     bool create_if_missing) {
  state::DbOptions options;
  options.tables = {kStateTable, kBlocksTable, kTxsTable, kMetaTable, kMempoolTable};
  options.schema_version = kSchemaVersion;
  options.create_if_missing = create_if_missing;
  return state::Db::Open(home + "/" + kDataDir, std::move(options));
}

absl::StatusOr<Meta> ReadMeta(const state::Db& db) {
  Meta meta;
  TS_ASSIGN_OR_RETURN(meta.genesis_hash, db.Get(kMetaTable, kMetaGenesisHash));
  TS_ASSIGN_OR_RETURN(std::string height, db.Get(kMetaTable, kMetaLatestHeight));
  TS_ASSIGN_OR_RETURN(meta.app_hash, db.Get(kMetaTable, kMetaAppHash));
  if (height.size() != 8) {
    return absl::DataLossError(
        absl::StrCat("meta.latest_height: ", height.size(), " bytes, expected 8"));
  }
  uint64_t h = state::DecodeU64Key(height);
  if (h > static_cast<uint64_t>(INT64_MAX)) {
    return absl::DataLossError(absl::StrCat("meta.latest_height: ", h, " is out of range"));
  }
  meta.latest_height = static_cast<int64_t>(h);
  if (meta.genesis_hash.size() != common::kSha256Size) {
    return absl::DataLossError(absl::StrCat("meta.genesis_hash: ", meta.genesis_hash.size(),
                                            " bytes, expected ", common::kSha256Size));
  }
  return meta;
}

absl::StatusOr<pb::StoredBlock> ReadBlock(const state::Db& db, int64_t height) {
  pb::StoredBlock block;
  TS_RETURN_IF_ERROR(db.GetProto(kBlocksTable, state::EncodeU64Key(height), &block));
  if (block.block().header().height() != height || block.results().height() != height) {
    return absl::DataLossError(absl::StrCat("blocks[", height, "]: stored block names height ",
                                            block.block().header().height(), " and results height ",
                                            block.results().height()));
  }
  return block;
}

absl::StatusOr<TxLocation> ReadTxLocation(const state::Db& db, std::string_view tx_hash) {
  TS_ASSIGN_OR_RETURN(std::string bytes, db.Get(kTxsTable, tx_hash));
  return DecodeTxLocation(bytes);
}

absl::StatusOr<std::map<std::string, std::string>> ReadState(const state::Db& db) {
  std::map<std::string, std::string> out;
  TS_RETURN_IF_ERROR(db.Scan(kStateTable, "", [&](std::string_view k, std::string_view v) {
    out.emplace_hint(out.end(), std::string(k), std::string(v));
    return true;
  }));
  return out;
}

std::string EncodeTxLocation(const TxLocation& loc) {
  std::string out = state::EncodeU64Key(static_cast<uint64_t>(loc.height));
  for (int shift = 24; shift >= 0; shift -= 8) {
    out.push_back(static_cast<char>((loc.index >> shift) & 0xff));
  }
  return out;
}

absl::StatusOr<TxLocation> DecodeTxLocation(std::string_view bytes) {
  if (bytes.size() != 12) {
    return absl::DataLossError(
        absl::StrCat("txs: location of ", bytes.size(), " bytes, expected 12"));
  }
  TxLocation loc;
  loc.height = static_cast<int64_t>(state::DecodeU64Key(bytes));
  for (int i = 8; i < 12; ++i) loc.index = (loc.index << 8) | static_cast<unsigned char>(bytes[i]);
  return loc;
}

std::string HeaderHash(const tendermint::types::Header& header) {
  return common::Sha256(DeterministicBytes(header));
}

std::string DataHash(const std::vector<std::string>& txs) {
  common::Sha256Hasher hasher;
  for (const std::string& tx : txs) hasher.Update(common::Sha256(tx));
  return hasher.Finish();
}

absl::Status WriteFileAtomic(const std::string& path, std::string_view content) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("creating", tmp);
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = Errno("writing", tmp);
      ::close(fd);
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    absl::Status s = Errno("syncing", tmp);
    ::close(fd);
    return s;
  }
  if (::close(fd) != 0) return Errno("closing", tmp);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return Errno("renaming into", path);
  // The rename itself is durable only once the directory is synced.
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return Errno("opening directory", dir);
  int rc = ::fsync(dfd);
  ::close(dfd);
  if (rc != 0) return Errno("syncing directory", dir);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  // genesis.json with tens of thousands of accounts stays well below this.
  constexpr size_t kFileBytesMax = 256 << 20;
  // A FIFO or device under the name is refused at once (common/regular_file.h).
  absl::StatusOr<std::string> read = common::ReadRegularFile("file", path, kFileBytesMax);
  if (absl::IsNotFound(read.status())) {
    return absl::NotFoundError(absl::StrCat(path, " does not exist"));
  }
  return read;
}

}  // namespace ts::bridge::devnet
