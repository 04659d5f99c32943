#include "chain-bridge/devnet/node.h"

#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chain-bridge/devnet/rpc_server.h"
#include "chain-bridge/devnet/services.h"
#include "chain-bridge/devnet/store.h"
#include "chain-bridge/module/app.h"
#include "chain-bridge/module/tx.h"
#include "chain-bridge/module/tx_errors.h"
#include "common/crypto/hash.h"
#include "common/hex.h"
#include "common/log.h"
#include "common/status.h"
#include "google/protobuf/util/json_util.h"

namespace ts::bridge {

using cosmos::base::abci::v1beta1::TxResponse;
using devnet::HeaderHash;

namespace {

constexpr std::string_view kComponent = "devnet";
// Recent blocks kept parsed in memory: followers read the newest heights over and over.
constexpr size_t kBlockCacheSize = 32;
// A refusal before CheckTx, reported as the SDK reports it (tx_errors.h).
TxResponse Refused(std::string_view tx_bytes, SdkCode code, std::string_view detail) {
  absl::Status status = SdkError(code, detail);
  TxCode tx_code = TxCodeOf(status);
  TxResponse r;
  r.set_code(tx_code.code);
  r.set_codespace(tx_code.codespace);
  r.set_raw_log(std::string(status.message()));
  r.set_txhash(TxHash(tx_bytes));
  return r;
}

std::string GenesisPath(const std::string& home) { return home + "/" + devnet::kGenesisFile; }

struct GenesisFile {
  pb::Genesis genesis;
  std::string hash;  // SHA-256 of the file's bytes
};

absl::StatusOr<GenesisFile> ReadGenesisFile(const std::string& home) {
  TS_ASSIGN_OR_RETURN(std::string bytes, devnet::ReadFile(GenesisPath(home)));
  GenesisFile out;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto status = google::protobuf::util::JsonStringToMessage(bytes, &out.genesis, options);
  if (!status.ok()) {
    return absl::DataLossError(
        absl::StrCat(GenesisPath(home), " does not parse as a Genesis: ", status.ToString()));
  }
  out.hash = common::Sha256(bytes);
  return out;
}

google::protobuf::Timestamp ToTimestamp(int64_t unix_ms) {
  google::protobuf::Timestamp t;
  int64_t seconds = unix_ms / 1000;
  int64_t ms = unix_ms % 1000;
  if (ms < 0) {
    ms += 1000;
    seconds -= 1;
  }
  t.set_seconds(seconds);
  t.set_nanos(static_cast<int32_t>(ms * 1000000));
  return t;
}

int64_t ToUnixMs(const google::protobuf::Timestamp& t) {
  return t.seconds() * 1000 + t.nanos() / 1000000;
}

absl::Status ValidateOptions(const DevnetOptions& o) {
  if (o.block_interval_ms <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.block_interval_ms: ", o.block_interval_ms, " must be positive"));
  }
  if (o.max_block_txs == 0) {
    return absl::InvalidArgumentError("options.max_block_txs: 0 must be positive");
  }
  if (o.max_block_bytes < kMaxTxBytes) {
    return absl::InvalidArgumentError(absl::StrCat("options.max_block_bytes: ", o.max_block_bytes,
                                                   " is below the largest tx, ", kMaxTxBytes));
  }
  if (o.mempool_max_txs == 0) {
    return absl::InvalidArgumentError("options.mempool_max_txs: 0 must be positive");
  }
  if (o.broadcast_block_timeout_ms <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.broadcast_block_timeout_ms: ", o.broadcast_block_timeout_ms, " must be positive"));
  }
  if (o.max_block_waiters <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.max_block_waiters: ", o.max_block_waiters, " must be positive"));
  }
  if (o.max_receive_message_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.max_receive_message_bytes: ", o.max_receive_message_bytes, " must be positive"));
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Genesis files

absl::Status InitHome(const std::string& home, const pb::Genesis& genesis) {
  // A genesis the App refuses must never be written.
  TS_RETURN_IF_ERROR(App::InitChain(genesis).status());
  std::error_code ec;
  std::filesystem::create_directories(home, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("creating home ", home, ": ", ec.message()));
  }
  const std::string path = GenesisPath(home);
  if (std::filesystem::exists(path, ec)) {
    return absl::AlreadyExistsError(absl::StrCat(path, " already exists"));
  }
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  auto status = google::protobuf::util::MessageToJsonString(genesis, &json, options);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("encoding genesis: ", status.ToString()));
  }
  return devnet::WriteFileAtomic(path, json);
}

absl::StatusOr<pb::Genesis> ReadGenesis(const std::string& home) {
  TS_ASSIGN_OR_RETURN(GenesisFile file, ReadGenesisFile(home));
  return std::move(file.genesis);
}

// ---------------------------------------------------------------------------------------------
// The node

struct DevnetNode::Impl final : public devnet::Backend {
  struct MempoolTx {
    uint64_t seq = 0;  // arrival number: its key in the mempool table
    std::string hash;  // 32-byte SHA-256
    std::string bytes;
  };

  std::string home;
  DevnetOptions options;
  common::Clock* clock = nullptr;
  std::unique_ptr<state::Db> db;
  std::string chain_id;

  // Guards the App, the mempool and the header chain. Held while a block executes, commits and
  // rechecks, so CheckTx never sees a half-committed App; released during the block's synced
  // write, which `persisting` marks.
  mutable absl::Mutex mu;
  std::unique_ptr<App> app ABSL_GUARDED_BY(mu);
  std::deque<MempoolTx> mempool ABSL_GUARDED_BY(mu);
  std::unordered_set<std::string> mempool_hashes ABSL_GUARDED_BY(mu);
  uint64_t next_mempool_seq ABSL_GUARDED_BY(mu) = 0;
  // Header of the latest block (unset at height 0).
  std::optional<tendermint::types::Header> last_header ABSL_GUARDED_BY(mu);
  // Set when a block could not be executed or persisted: the in-memory App may be ahead of the
  // disk, so no further block is produced and broadcasts are refused.
  absl::Status producer_error ABSL_GUARDED_BY(mu);
  DevnetStats stats ABSL_GUARDED_BY(mu);
  // True while a block committed in memory is being written: its state is not shown yet.
  bool persisting ABSL_GUARDED_BY(mu) = false;

  bool Settled() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return !persisting; }

  // Guards what readers of blocks need, so block and tx lookups never wait for a block in
  // progress.
  mutable absl::Mutex blocks_mu;
  absl::CondVar block_done;
  int64_t latest_height ABSL_GUARDED_BY(blocks_mu) = 0;
  std::string latest_app_hash ABSL_GUARDED_BY(blocks_mu);
  std::map<int64_t, std::shared_ptr<const pb::StoredBlock>> block_cache ABSL_GUARDED_BY(blocks_mu);
  // CometBFT JSON-RPC, when options.rpc_listen_address is set: started before the producer and
  // stopped after it, so the producer may use it without a lock.
  std::unique_ptr<devnet::RpcServer> rpc;
  int block_waiters ABSL_GUARDED_BY(blocks_mu) = 0;
  bool stopping ABSL_GUARDED_BY(blocks_mu) = false;

  // Lifecycle.
  absl::Mutex life_mu;
  bool started ABSL_GUARDED_BY(life_mu) = false;
  bool shut_down ABSL_GUARDED_BY(life_mu) = false;
  std::string listen_address ABSL_GUARDED_BY(life_mu);
  std::vector<std::unique_ptr<grpc::Service>> services;
  std::unique_ptr<grpc::Server> server;
  std::thread producer;

  // --- Backend ---------------------------------------------------------------------------------

  absl::StatusOr<TxResponse> Broadcast(std::string tx_bytes,
                                       cosmos::tx::v1beta1::BroadcastMode mode,
                                       std::chrono::system_clock::time_point deadline) override {
    std::string hash = common::Sha256(tx_bytes);
    TxResponse check;
    {
      absl::MutexLock lock(&mu);
      if (!producer_error.ok()) {
        return absl::UnavailableError(
            absl::StrCat("the node stopped producing blocks: ", producer_error.ToString()));
      }
      // Refusals before CheckTx answer as the chain refuses a tx (docs/protocol.md, "Error
      // codes"): a TxResponse with the canonical code, so every client handles them alike.
      if (mempool_hashes.contains(hash)) {
        return Refused(tx_bytes, SdkCode::kTxInMempoolCache, "tx: already in the mempool");
      }
      if (mempool.size() >= options.mempool_max_txs) {
        return Refused(
            tx_bytes, SdkCode::kMempoolIsFull,
            absl::StrCat("mempool: full at ", mempool.size(), " txs (options.mempool_max_txs)"));
      }
      const absl::Time check_start = absl::Now();
      check = app->CheckTx(tx_bytes);
      stats.check_ms += absl::ToDoubleMilliseconds(absl::Now() - check_start);
      ++stats.check_txs;
      if (check.txhash().empty()) check.set_txhash(TxHash(tx_bytes));
      if (check.code() == 0) {
        // An accepted tx survives a crash of the process: the write reaches RocksDB's log in
        // the kernel's page cache (not synced: a power loss may drop it, as it drops a mempool
        // in CometBFT). The next block's synced batch makes it durable.
        const uint64_t seq = next_mempool_seq++;
        state::WriteBatch batch;
        batch.Put(devnet::kMempoolTable, state::EncodeU64Key(seq), tx_bytes);
        absl::Status written = db->Write(batch, /*sync=*/false);
        if (!written.ok()) {
          common::Log(common::LogLevel::kWarn, kComponent, "mempool tx not stored",
                      {{"error", written.ToString()}});
        }
        mempool_hashes.insert(hash);
        mempool.push_back(MempoolTx{seq, hash, std::move(tx_bytes)});
      }
    }
    if (mode != cosmos::tx::v1beta1::BROADCAST_MODE_BLOCK || check.code() != 0) return check;
    return WaitIncluded(hash, deadline);
  }

  absl::StatusOr<TxResponse> WaitIncluded(const std::string& hash,
                                          std::chrono::system_clock::time_point call_deadline) {
    absl::Time deadline =
        std::min(absl::FromChrono(call_deadline),
                 absl::Now() + absl::Milliseconds(options.broadcast_block_timeout_ms));
    {
      absl::MutexLock lock(&blocks_mu);
      if (block_waiters >= options.max_block_waiters) {
        return absl::ResourceExhaustedError(
            absl::StrCat("broadcast: ", block_waiters, " calls already wait for blocks (the cap)"));
      }
      ++block_waiters;
    }
    absl::StatusOr<TxResponse> result = WaitIncludedLocked(hash, deadline);
    absl::MutexLock lock(&blocks_mu);
    --block_waiters;
    return result;
  }

  absl::StatusOr<TxResponse> WaitIncludedLocked(const std::string& hash, absl::Time deadline) {
    while (true) {
      int64_t seen;
      {
        absl::MutexLock lock(&blocks_mu);
        seen = latest_height;
      }
      absl::StatusOr<std::pair<std::shared_ptr<const pb::StoredBlock>, uint32_t>> found =
          FindTx(hash);
      if (found.ok()) return devnet::DeliveredTxResponse(*found->first, found->second);
      if (!absl::IsNotFound(found.status())) return found.status();
      {
        // Holding `mu` with no block being written means no block is half done: absent from
        // both the mempool and the index, the tx was dropped by a recheck.
        absl::MutexLock lock(&mu, absl::Condition(this, &Impl::Settled));
        if (!mempool_hashes.contains(hash)) {
          found = FindTx(hash);
          if (found.ok()) return devnet::DeliveredTxResponse(*found->first, found->second);
          return absl::AbortedError(absl::StrCat(
              "tx ", common::HexEncodeUpper(hash),
              " left the mempool without being included: it became invalid after a block"));
        }
      }
      absl::MutexLock lock(&blocks_mu);
      while (latest_height == seen && !stopping) {
        if (block_done.WaitWithDeadline(&blocks_mu, deadline)) break;
      }
      if (stopping) return absl::UnavailableError("the node is shutting down");
      if (latest_height == seen) {
        return absl::DeadlineExceededError(absl::StrCat("tx ", common::HexEncodeUpper(hash),
                                                        " was not included in a block in time"));
      }
    }
  }

  absl::StatusOr<std::shared_ptr<const pb::StoredBlock>> Block(int64_t height) override {
    {
      absl::MutexLock lock(&blocks_mu);
      if (height > latest_height) {
        return absl::NotFoundError(
            absl::StrCat("height ", height, " is past the latest height ", latest_height));
      }
      auto it = block_cache.find(height);
      if (it != block_cache.end()) return it->second;
    }
    TS_ASSIGN_OR_RETURN(pb::StoredBlock block, devnet::ReadBlock(*db, height));
    return std::make_shared<const pb::StoredBlock>(std::move(block));
  }

  absl::StatusOr<std::pair<std::shared_ptr<const pb::StoredBlock>, uint32_t>> FindTx(
      std::string_view tx_hash) override {
    absl::StatusOr<devnet::TxLocation> loc = devnet::ReadTxLocation(*db, tx_hash);
    if (absl::IsNotFound(loc.status())) {
      return absl::NotFoundError(
          absl::StrCat("tx ", common::HexEncodeUpper(tx_hash), " is not in any block yet"));
    }
    TS_RETURN_IF_ERROR(loc.status());
    TS_ASSIGN_OR_RETURN(std::shared_ptr<const pb::StoredBlock> block, Block(loc->height));
    if (loc->index >= static_cast<uint32_t>(block->block().data().txs_size())) {
      return absl::DataLossError(absl::StrCat("txs: index ", loc->index, " is past block ",
                                              loc->height, "'s ", block->block().data().txs_size(),
                                              " txs"));
    }
    return std::make_pair(std::move(block), loc->index);
  }

  absl::StatusOr<TxResponse> Simulate(std::string_view tx_bytes) override {
    absl::MutexLock lock(&mu);
    if (!producer_error.ok()) {
      return absl::UnavailableError(
          absl::StrCat("the node stopped producing blocks: ", producer_error.ToString()));
    }
    return app->Simulate(tx_bytes);
  }

  absl::Status WithApp(const std::function<void(const App&)>& fn) override {
    absl::MutexLock lock(&mu, absl::Condition(this, &Impl::Settled));
    if (!producer_error.ok()) {
      return absl::UnavailableError(
          absl::StrCat("the node stopped producing blocks: ", producer_error.ToString()));
    }
    fn(*app);
    return absl::OkStatus();
  }

  // Runs CheckTx over the mempool in arrival order, in one pass (linear in its size), and drops
  // what fails. Returns the deletions of the dropped txs' mempool rows, for the caller to write.
  state::WriteBatch RecheckMempool() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::deque<MempoolTx> kept;
    state::WriteBatch dropped;
    for (MempoolTx& tx : mempool) {
      if (kept.size() < options.mempool_max_txs && app->CheckTx(tx.bytes).code() == 0) {
        kept.push_back(std::move(tx));
      } else {
        mempool_hashes.erase(tx.hash);
        dropped.Delete(devnet::kMempoolTable, state::EncodeU64Key(tx.seq));
      }
    }
    mempool.swap(kept);
    return dropped;
  }

  // Reloads the txs accepted before a restart, oldest first, and rechecks them.
  absl::Status LoadMempool() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::vector<std::pair<std::string, std::string>> rows;
    TS_RETURN_IF_ERROR(
        db->Scan(devnet::kMempoolTable, "", [&](std::string_view key, std::string_view value) {
          rows.emplace_back(std::string(key), std::string(value));
          return true;
        }));
    state::WriteBatch stray;
    for (auto& [key, value] : rows) {
      std::string hash = common::Sha256(value);
      if (key.size() != 8 || !mempool_hashes.insert(hash).second) {
        stray.Delete(devnet::kMempoolTable, key);  // not a row this code keeps
        continue;
      }
      const uint64_t seq = state::DecodeU64Key(key);
      next_mempool_seq = std::max(next_mempool_seq, seq + 1);
      mempool.push_back(MempoolTx{seq, std::move(hash), std::move(value)});
    }
    if (stray.size() > 0) TS_RETURN_IF_ERROR(db->Write(stray, /*sync=*/false));
    state::WriteBatch dropped = RecheckMempool();
    if (dropped.size() > 0) TS_RETURN_IF_ERROR(db->Write(dropped, /*sync=*/false));
    return absl::OkStatus();
  }

  // --- Block production ------------------------------------------------------------------------

  void ProducerLoop() {
    absl::Time next = absl::Now() + absl::Milliseconds(options.block_interval_ms);
    while (true) {
      {
        absl::MutexLock lock(&blocks_mu);
        while (!stopping && absl::Now() < next) block_done.WaitWithDeadline(&blocks_mu, next);
        if (stopping) return;
      }
      absl::Status s = ProduceBlock();
      if (!s.ok()) {
        common::Log(common::LogLevel::kError, kComponent, "block production stopped",
                    {{"error", s.ToString()}});
        return;
      }
      // Keep the cadence, but never try to catch up with a burst of empty blocks.
      next = std::max(next + absl::Milliseconds(options.block_interval_ms), absl::Now());
    }
  }

  // One block in three steps. Under `mu`: execute, commit in memory and recheck the mempool.
  // Without `mu`: the synced write, so broadcasts' CheckTx goes on during the disk's sync; state
  // queries wait for it (`persisting`), so nothing not yet durable is ever shown. Under `mu`
  // again: the block counts as done.
  absl::Status ProduceBlock() {
    const absl::Time block_start = absl::Now();
    absl::Time finalized, committed;
    state::WriteBatch batch;
    state::WriteBatch dropped;
    std::shared_ptr<pb::StoredBlock> stored;
    int64_t height = 0;
    size_t included = 0, rechecked = 0;
    {
      absl::MutexLock lock(&mu);
      std::vector<std::string> txs;
      std::vector<std::string> hashes;
      std::vector<uint64_t> seqs;
      size_t bytes = 0;
      while (!mempool.empty() && txs.size() < options.max_block_txs) {
        MempoolTx& next = mempool.front();
        if (!txs.empty() && bytes + next.bytes.size() > options.max_block_bytes) break;
        bytes += next.bytes.size();
        mempool_hashes.erase(next.hash);
        seqs.push_back(next.seq);
        hashes.push_back(std::move(next.hash));
        txs.push_back(std::move(next.bytes));
        mempool.pop_front();
      }

      height = app->height() + 1;
      tendermint::types::Header header;
      header.set_chain_id(chain_id);
      header.set_height(height);
      int64_t now_ms = clock->NowUnixMs();
      // Block times strictly increase, as CometBFT requires, even if the wall clock steps back.
      if (last_header.has_value()) now_ms = std::max(now_ms, ToUnixMs(last_header->time()) + 1);
      *header.mutable_time() = ToTimestamp(now_ms);
      if (last_header.has_value()) {
        header.mutable_last_block_id()->set_hash(HeaderHash(*last_header));
      }
      header.set_data_hash(devnet::DataHash(txs));
      header.set_app_hash(app->app_hash());

      absl::StatusOr<BlockOutcome> finalize = app->FinalizeBlock(header, txs);
      if (!finalize.ok()) {
        producer_error = finalize.status();
        return finalize.status();
      }
      BlockOutcome outcome = *std::move(finalize);
      finalized = absl::Now();

      stored = std::make_shared<pb::StoredBlock>();
      *stored->mutable_block()->mutable_header() = header;
      for (std::string& tx : txs) stored->mutable_block()->mutable_data()->add_txs(std::move(tx));
      *stored->mutable_results() = std::move(outcome.results);
      stored->mutable_results()->set_height(height);

      // One synced batch: a crash leaves the whole block or none of it.
      for (const StateChange& c : outcome.changes) {
        if (c.value.has_value()) {
          batch.Put(devnet::kStateTable, c.key, *c.value);
        } else {
          batch.Delete(devnet::kStateTable, c.key);
        }
      }
      batch.PutProto(devnet::kBlocksTable, state::EncodeU64Key(static_cast<uint64_t>(height)),
                     *stored);
      for (uint32_t i = 0; i < hashes.size(); ++i) {
        batch.Put(devnet::kTxsTable, hashes[i], devnet::EncodeTxLocation({height, i}));
        batch.Delete(devnet::kMempoolTable, state::EncodeU64Key(seqs[i]));
      }
      batch.Put(devnet::kMetaTable, devnet::kMetaLatestHeight,
                state::EncodeU64Key(static_cast<uint64_t>(height)));
      batch.Put(devnet::kMetaTable, devnet::kMetaAppHash, stored->results().app_hash());

      app->Commit();
      last_header = header;
      included = hashes.size();
      rechecked = mempool.size();
      dropped = RecheckMempool();
      persisting = true;
      committed = absl::Now();
    }

    absl::Status written = db->Write(batch, /*sync=*/true);
    const absl::Time persisted = absl::Now();
    // Rows of txs the recheck dropped go only after the block: a crash before it brings them
    // back with the block's own txs, in their order.
    if (written.ok() && dropped.size() > 0) {
      absl::Status s = db->Write(dropped, /*sync=*/false);
      if (!s.ok()) {
        // Harmless: the next start's recheck drops them again.
        common::Log(common::LogLevel::kWarn, kComponent, "dropping mempool rows failed",
                    {{"error", s.ToString()}});
      }
    }

    {
      absl::MutexLock lock(&mu);
      persisting = false;
      if (!written.ok()) {
        // The App is now ahead of the disk: producer_error stops everything that would show it.
        producer_error = written;
        return written;
      }
      ++stats.blocks;
      stats.block_txs += static_cast<int64_t>(included);
      stats.block_ms += absl::ToDoubleMilliseconds(persisted - block_start);
      stats.finalize_ms += absl::ToDoubleMilliseconds(finalized - block_start);
      stats.recheck_ms += absl::ToDoubleMilliseconds(committed - finalized);
      stats.persist_ms += absl::ToDoubleMilliseconds(persisted - committed);
      stats.rechecked_txs += static_cast<int64_t>(rechecked);
      // Published before `mu` is released, so a query that sees the new state also finds the
      // new block.
      absl::MutexLock blocks_lock(&blocks_mu);
      latest_height = height;
      latest_app_hash = stored->results().app_hash();
      block_cache.emplace(height, stored);
      while (block_cache.size() > kBlockCacheSize) block_cache.erase(block_cache.begin());
      block_done.SignalAll();
    }
    // The JSON-RPC server indexes it and tells its subscribers (it never waits on them).
    if (rpc != nullptr) rpc->Publish(std::move(stored));
    return absl::OkStatus();
  }
};

DevnetNode::DevnetNode(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DevnetNode::~DevnetNode() { Shutdown(); }

absl::StatusOr<std::unique_ptr<DevnetNode>> DevnetNode::Open(const std::string& home,
                                                             DevnetOptions options) {
  TS_RETURN_IF_ERROR(ValidateOptions(options));
  TS_ASSIGN_OR_RETURN(GenesisFile genesis, ReadGenesisFile(home));
  auto impl = std::make_unique<Impl>();
  impl->home = home;
  impl->options = options;
  impl->clock = options.clock != nullptr ? options.clock : &common::SystemClock();
  impl->chain_id = genesis.genesis.chain_id();
  TS_ASSIGN_OR_RETURN(impl->db, devnet::OpenStore(home, /*create_if_missing=*/true));

  std::unique_ptr<App> app;
  std::optional<tendermint::types::Header> last_header;
  absl::StatusOr<devnet::Meta> meta = devnet::ReadMeta(*impl->db);
  if (absl::IsNotFound(meta.status())) {
    // A new chain: the genesis state is stored with the meta records in one batch, so a crash
    // here leaves either nothing (and this runs again) or a complete height 0.
    TS_ASSIGN_OR_RETURN(app, App::InitChain(genesis.genesis));
    state::WriteBatch batch;
    for (const auto& [k, v] : app->state()) batch.Put(devnet::kStateTable, k, v);
    batch.Put(devnet::kMetaTable, devnet::kMetaGenesisHash, genesis.hash);
    batch.Put(devnet::kMetaTable, devnet::kMetaLatestHeight, state::EncodeU64Key(0));
    batch.Put(devnet::kMetaTable, devnet::kMetaAppHash, app->app_hash());
    TS_RETURN_IF_ERROR(impl->db->Write(batch, /*sync=*/true));
  } else {
    TS_RETURN_IF_ERROR(meta.status());
    if (meta->genesis_hash != genesis.hash) {
      return absl::FailedPreconditionError(
          absl::StrCat("database ", home, "/data was started from genesis ",
                       common::HexEncode(meta->genesis_hash), ", but genesis.json hashes to ",
                       common::HexEncode(genesis.hash)));
    }
    if (meta->latest_height == 0) {
      TS_ASSIGN_OR_RETURN(app, App::InitChain(genesis.genesis));
    } else {
      TS_ASSIGN_OR_RETURN(pb::StoredBlock latest,
                          devnet::ReadBlock(*impl->db, meta->latest_height));
      if (latest.results().app_hash() != meta->app_hash) {
        return absl::DataLossError(absl::StrCat("meta.app_hash ", common::HexEncode(meta->app_hash),
                                                " differs from block ", meta->latest_height, "'s ",
                                                common::HexEncode(latest.results().app_hash())));
      }
      last_header = latest.block().header();
      TS_ASSIGN_OR_RETURN(auto state, devnet::ReadState(*impl->db));
      TS_ASSIGN_OR_RETURN(app, App::Restore(genesis.genesis, std::move(state), meta->latest_height,
                                            meta->app_hash));
    }
    if (app->app_hash() != meta->app_hash) {
      return absl::DataLossError(
          absl::StrCat("restored app hash ", common::HexEncode(app->app_hash()),
                       " differs from meta.app_hash ", common::HexEncode(meta->app_hash)));
    }
  }
  {
    absl::MutexLock lock(&impl->blocks_mu);
    impl->latest_height = app->height();
    impl->latest_app_hash = app->app_hash();
  }
  {
    absl::MutexLock lock(&impl->mu);
    impl->app = std::move(app);
    impl->last_header = std::move(last_header);
    TS_RETURN_IF_ERROR(impl->LoadMempool());
  }
  return std::unique_ptr<DevnetNode>(new DevnetNode(std::move(impl)));
}

absl::Status DevnetNode::Start() {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.life_mu);
  if (s.started || s.shut_down) {
    return absl::FailedPreconditionError("devnet node: Start called twice or after Shutdown");
  }
  s.services = devnet::MakeServices(&s);
  // Server reflection (grpc.reflection.v1alpha), so that grpcurl and other tools list and
  // describe the services. The plugin is process-wide and registers once.
  static std::once_flag reflection_once;
  std::call_once(reflection_once,
                 [] { grpc::reflection::InitProtoReflectionServerBuilderPlugin(); });
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(s.options.listen_address, grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(s.options.max_receive_message_bytes);
  grpc::ResourceQuota quota("devnet");
  // Bounds the handler threads; a call beyond them waits in gRPC's queue instead.
  quota.SetMaxThreads(64);
  builder.SetResourceQuota(quota);
  // Enough polling threads that a handler waiting for the App's mutex does not make gRPC create
  // and destroy a thread per call.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::NUM_CQS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 4);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 16);
  for (auto& service : s.services) builder.RegisterService(service.get());
  s.server = builder.BuildAndStart();
  if (s.server == nullptr || port == 0) {
    s.server.reset();
    return absl::UnavailableError(
        absl::StrCat("options.listen_address: cannot listen on ", s.options.listen_address));
  }
  const std::string& requested = s.options.listen_address;
  std::string host = requested.substr(0, requested.rfind(':'));
  s.listen_address = absl::StrCat(host, ":", port);
  absl::Status written =
      devnet::WriteFileAtomic(s.home + "/" + devnet::kAddrFile, s.listen_address + "\n");
  if (!written.ok()) {
    s.server->Shutdown();
    s.server.reset();
    return written;
  }
  if (!s.options.rpc_listen_address.empty()) {
    devnet::RpcServerOptions rpc_options;
    rpc_options.listen_address = s.options.rpc_listen_address;
    rpc_options.grpc_target = s.listen_address;
    rpc_options.commit_timeout_ms = s.options.broadcast_block_timeout_ms;
    auto rpc = devnet::RpcServer::Start(&s, rpc_options);
    absl::Status rpc_written = rpc.ok()
                                   ? devnet::WriteFileAtomic(s.home + "/" + devnet::kRpcAddrFile,
                                                             (*rpc)->listen_address() + "\n")
                                   : rpc.status();
    if (!rpc_written.ok()) {
      s.server->Shutdown();
      s.server.reset();
      return rpc_written;
    }
    s.rpc = *std::move(rpc);
  }
  s.started = true;
  s.producer = std::thread([&s] { s.ProducerLoop(); });
  common::Log(common::LogLevel::kInfo, kComponent, "listening",
              {{"address", s.listen_address},
               {"chain_id", s.chain_id},
               {"height", std::to_string(height())}});
  return absl::OkStatus();
}

void DevnetNode::Shutdown() {
  Impl& s = *impl_;
  absl::MutexLock lock(&s.life_mu);
  if (s.shut_down) return;
  s.shut_down = true;
  {
    absl::MutexLock blocks_lock(&s.blocks_mu);
    s.stopping = true;
    s.block_done.SignalAll();
  }
  if (s.producer.joinable()) s.producer.join();
  s.rpc.reset();
  if (s.server != nullptr) {
    // Calls in flight get a moment to finish; block waiters were woken above.
    s.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    s.server->Wait();
    s.server.reset();
  }
}

std::string DevnetNode::rpc_listen_address() const {
  absl::MutexLock lock(&impl_->life_mu);
  return impl_->rpc == nullptr ? "" : impl_->rpc->listen_address();
}

std::string DevnetNode::listen_address() const {
  absl::MutexLock lock(&impl_->life_mu);
  return impl_->listen_address;
}

int64_t DevnetNode::height() const {
  absl::MutexLock lock(&impl_->blocks_mu);
  return impl_->latest_height;
}

std::string DevnetNode::app_hash() const {
  absl::MutexLock lock(&impl_->blocks_mu);
  return impl_->latest_app_hash;
}

std::string DevnetNode::chain_id() const { return impl_->chain_id; }

size_t DevnetNode::mempool_size() const {
  absl::MutexLock lock(&impl_->mu, absl::Condition(impl_.get(), &Impl::Settled));
  return impl_->mempool.size();
}

DevnetStats DevnetNode::stats() const {
  absl::MutexLock lock(&impl_->mu, absl::Condition(impl_.get(), &Impl::Settled));
  return impl_->stats;
}

// ---------------------------------------------------------------------------------------------
// Replay

absl::StatusOr<ReplayReport> Replay(const std::string& home) {
  TS_ASSIGN_OR_RETURN(GenesisFile genesis, ReadGenesisFile(home));
  TS_ASSIGN_OR_RETURN(std::unique_ptr<state::Db> db,
                      devnet::OpenStore(home, /*create_if_missing=*/false));
  TS_ASSIGN_OR_RETURN(devnet::Meta meta, devnet::ReadMeta(*db));
  if (meta.genesis_hash != genesis.hash) {
    return absl::FailedPreconditionError(
        absl::StrCat("database ", home, "/data belongs to another genesis.json"));
  }
  TS_ASSIGN_OR_RETURN(std::unique_ptr<App> app, App::InitChain(genesis.genesis));

  ReplayReport report;
  report.latest_height = meta.latest_height;
  auto mismatch = [&](int64_t height, std::string what) {
    report.first_mismatch_height = height;
    report.mismatch = std::move(what);
  };
  std::optional<tendermint::types::Header> prev;
  for (int64_t h = 1; h <= meta.latest_height; ++h) {
    absl::StatusOr<pb::StoredBlock> block = devnet::ReadBlock(*db, h);
    if (!block.ok()) {
      mismatch(h, absl::StrCat("stored block unreadable: ", block.status().ToString()));
      break;
    }
    const tendermint::types::Header& header = block->block().header();
    std::vector<std::string> txs(block->block().data().txs().begin(),
                                 block->block().data().txs().end());
    if (header.chain_id() != genesis.genesis.chain_id()) {
      mismatch(h, absl::StrCat("header.chain_id \"", header.chain_id(), "\" is not the genesis's"));
      break;
    }
    if (header.app_hash() != app->app_hash()) {
      mismatch(h, absl::StrCat("header.app_hash ", common::HexEncode(header.app_hash()),
                               " is not the app hash after height ", h - 1, ", ",
                               common::HexEncode(app->app_hash())));
      break;
    }
    const std::string expected_last = prev.has_value() ? HeaderHash(*prev) : std::string();
    if (header.last_block_id().hash() != expected_last) {
      mismatch(h, "header.last_block_id.hash is not the hash of the previous header");
      break;
    }
    if (header.data_hash() != devnet::DataHash(txs)) {
      mismatch(h, "header.data_hash is not the hash of the block's txs");
      break;
    }
    absl::StatusOr<BlockOutcome> outcome = app->FinalizeBlock(header, txs);
    if (!outcome.ok()) {
      mismatch(h, absl::StrCat("re-execution failed: ", outcome.status().ToString()));
      break;
    }
    const pb::BlockResults& stored = block->results();
    if (outcome->results.app_hash() != stored.app_hash()) {
      mismatch(h, absl::StrCat("app hash after the block is ",
                               common::HexEncode(outcome->results.app_hash()), ", stored ",
                               common::HexEncode(stored.app_hash())));
      break;
    }
    if (outcome->results.tx_results_size() != stored.tx_results_size()) {
      mismatch(h, absl::StrCat(outcome->results.tx_results_size(), " tx results, stored ",
                               stored.tx_results_size()));
      break;
    }
    bool codes_match = true;
    for (int i = 0; i < stored.tx_results_size() && codes_match; ++i) {
      if (outcome->results.tx_results(i).code() != stored.tx_results(i).code()) {
        mismatch(h, absl::StrCat("tx ", i, " code ", outcome->results.tx_results(i).code(),
                                 ", stored ", stored.tx_results(i).code()));
        codes_match = false;
      }
    }
    if (!codes_match) break;
    app->Commit();
    prev = header;
    ++report.blocks_replayed;
  }
  if (report.first_mismatch_height.has_value()) return report;

  TS_ASSIGN_OR_RETURN(auto stored_state, devnet::ReadState(*db));
  if (app->app_hash() != meta.app_hash) {
    report.mismatch = "meta.app_hash is not the app hash after the last block";
  } else if (stored_state != app->state()) {
    size_t differing = 0;
    for (const auto& [k, v] : app->state()) {
      auto it = stored_state.find(k);
      if (it == stored_state.end() || it->second != v) ++differing;
    }
    for (const auto& [k, v] : stored_state) {
      if (!app->state().contains(k)) ++differing;
    }
    report.mismatch = absl::StrCat("the stored state table differs from the replayed state in ",
                                   differing, " keys");
  } else {
    report.state_matches = true;
  }
  return report;
}

}  // namespace ts::bridge
