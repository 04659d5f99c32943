// Writes the seed corpus of the fuzz targets: real signed transactions, real addresses and real
// statement signatures, made with fixed keys so the output is the same on every run.
//   fuzz_make_seeds <corpus dir>   (writes <dir>/<target>/<seed name>)
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "chain-bridge/module/tx.h"
#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/crypto/secp256k1.h"
#include "common/crypto/signing.h"
#include "common/status.h"
#include "cosmos/bank/v1beta1/tx.pb.h"
#include "cosmos/crypto/secp256k1/keys.pb.h"
#include "gonka/trainshard/v1/chain.pb.h"
#include "gonka/trainshard/v1/shard.pb.h"
#include "proto/deterministic.h"
#include "sidecar/artifacts/manifest.h"
#include "sidecar/collective/codec.h"
#include "sidecar/collective/frame.h"
#include "sidecar/collective/tcp_transport.h"
#include "sidecar/peer/peer_auth.h"
#include "tests/fuzz/collective_frame_input.h"
#include "tests/fuzz/sign_bytes_input.h"

namespace {

namespace fs = std::filesystem;

ts::common::PrivateKey FixedKey(char fill) {
  auto key = ts::common::PrivateKey::FromBytes(std::string(32, fill));
  TS_CHECK(key.ok());
  return *std::move(key);
}

void Write(const fs::path& dir, const std::string& name, const std::string& bytes) {
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  TS_CHECK(out.good());
}

// A tx seed must reach the deep end of the target: decoded, and its signature valid.
void CheckTx(const std::string& tx_bytes, std::string_view chain_id, uint64_t account_number) {
  auto tx = ts::bridge::DecodeTx(tx_bytes);
  TS_CHECK(tx.ok());
  cosmos::crypto::secp256k1::PubKey pub;
  TS_CHECK(pub.ParseFromString(tx->auth_info.signer_infos(0).public_key().value()));
  const std::string digest = ts::common::Sha256(ts::bridge::DirectSignBytes(
      tx->raw.body_bytes(), tx->raw.auth_info_bytes(), chain_id, account_number));
  TS_CHECK(ts::common::VerifyCompact(pub.key(), digest, tx->raw.signatures(0)).ok());
}

void WriteTx(const fs::path& dir, const std::string& name, const std::string& tx_bytes,
             std::string_view chain_id, uint64_t account_number) {
  CheckTx(tx_bytes, chain_id, account_number);
  Write(dir, name, tx_bytes);
}

void WriteTxSeeds(const fs::path& dir) {
  const ts::common::PrivateKey alice = FixedKey('\x01');
  const ts::common::PrivateKey bob = FixedKey('\x02');
  const std::string alice_address = ts::common::AddressFromPublicKey(alice.public_key());
  const std::string bob_address = ts::common::AddressFromPublicKey(bob.public_key());

  cosmos::bank::v1beta1::MsgSend send;
  send.set_from_address(alice_address);
  send.set_to_address(bob_address);
  auto* coin = send.add_amount();
  coin->set_denom("ngonka");
  coin->set_amount("1000000");
  WriteTx(dir, "msg_send",
          ts::bridge::BuildSignedTx(alice, "gonka-devnet", /*account_number=*/7, /*sequence=*/3,
                                    {ts::bridge::PackMsg(send)}, ts::bridge::TxFee{200000, 200}),
          "gonka-devnet", 7);

  gonka::trainshard::v1::MsgReserveTrainshard reserve;
  auto* reservation = reserve.mutable_reservation();
  reservation->set_shard_id(1);
  reservation->set_host(bob_address);
  reservation->set_endpoint("10.0.0.2:7443");
  reservation->set_tls_cert_sha256(std::string(32, '\x5a'));
  reservation->set_valid_until_height(1000);
  WriteTx(dir, "msg_reserve_with_memo",
          ts::bridge::BuildSignedTx(bob, "gonka-devnet", /*account_number=*/8, /*sequence=*/0,
                                    {ts::bridge::PackMsg(reserve)}, ts::bridge::TxFee{150000, 0},
                                    "reserve shard 1"),
          "gonka-devnet", 8);

  gonka::trainshard::v1::MsgAssembleTrainshard assemble;
  assemble.set_creator(alice_address);
  assemble.set_shard_id(1);
  WriteTx(dir, "two_msgs",
          ts::bridge::BuildSignedTx(alice, "gonka-devnet", /*account_number=*/7, /*sequence=*/4,
                                    {ts::bridge::PackMsg(assemble), ts::bridge::PackMsg(send)},
                                    ts::bridge::TxFee{300000, 3}),
          "gonka-devnet", 7);
}

void WriteSignBytesSeeds(const fs::path& dir) {
  const ts::common::PrivateKey key = FixedKey('\x03');
  struct Statement {
    const char* name;
    uint8_t flags;
    std::string kind;
    std::string chain_id;
    uint64_t shard_id;
    std::string message;
  };
  const std::vector<Statement> statements = {
      {"settlement", 0, "settlement", "gonka-devnet", 1, std::string("\x0a\x04root", 6)},
      {"round_certificate_sign", ts::fuzz::kFlagSignAndRecover, "round_certificate",
       "gonka-mainnet", 0x0102030405060708ULL, "round 17"},
      {"reservation_empty_message", 0, "reservation", "c", 0, ""},
  };
  for (const auto& s : statements) {
    ts::fuzz::SignBytesInput in;
    in.flags = s.flags;
    in.kind = s.kind;
    in.chain_id = s.chain_id;
    in.shard_id = s.shard_id;
    in.message = s.message;
    auto sig = ts::common::SignStatement(key, s.kind, s.chain_id, s.shard_id, s.message);
    TS_CHECK(sig.ok());
    in.signature = *sig;
    Write(dir, s.name, ts::fuzz::SerializeSignBytesInput(in));
  }
  // A refused kind (upper case), so the refusal path is in the corpus from the start.
  ts::fuzz::SignBytesInput bad;
  bad.kind = "Settlement";
  bad.chain_id = "gonka-devnet";
  bad.signature = std::string(65, '\0');
  Write(dir, "bad_kind", ts::fuzz::SerializeSignBytesInput(bad));
}

void WriteAddressSeeds(const fs::path& dir) {
  std::string one(32, '\0');
  one[31] = 1;
  auto key_one = ts::common::PrivateKey::FromBytes(one);
  TS_CHECK(key_one.ok());
  Write(dir, "gonka_key_one", ts::common::AddressFromPublicKey(key_one->public_key()));
  Write(dir, "gonka_module", ts::common::ModuleAddress("trainshard"));
  Write(dir, "cosmos_gov", "cosmos10d07y265gmmuvt4z0w9aw880jnsr700j6zn9kn");
  Write(dir, "bip173_upper", "A12UEL5L");
  Write(dir, "bip173_alphabet", "abcdef1qpzry9x8gf2tvdw0s3jn54khce6mua7lmqqqxw");
  Write(dir, "bip173_segwit", "BC1QW508D6QEJXTDG4Y5R3ZARVARY0C5XW7KV8F3T4");
  Write(dir, "bip173_bad_checksum", "bc1qw508d6qejxtdg4y5r3zarvary0c5xw7kv8f3t5");
}

// Manifests signed by a fixed key, each checked to pass VerifyManifestBytes, and file names
// (the target checks every input as both).
void WriteManifestSeeds(const fs::path& dir) {
  const ts::common::PrivateKey key = FixedKey('\x04');
  struct File {
    std::string name;
    std::string data;
  };
  auto body_of = [](const std::vector<File>& files, std::string kind, uint64_t round,
                    std::string parent) {
    gonka::trainshard::v1::ManifestBody body;
    body.set_chain_id("gonka-devnet");
    body.set_shard_id(1);
    body.set_round(round);
    body.set_parent(std::move(parent));
    body.set_kind(std::move(kind));
    body.set_chunk_size(ts::sidecar::kMinChunkSize);
    for (const File& f : files) {
      auto* file = body.add_files();
      file->set_name(f.name);
      file->set_size(f.data.size());
      for (size_t off = 0; off < f.data.size(); off += ts::sidecar::kMinChunkSize) {
        file->add_chunks(ts::common::Sha256(f.data.substr(off, ts::sidecar::kMinChunkSize)));
      }
    }
    return body;
  };
  auto write_manifest = [&](const std::string& name,
                            const gonka::trainshard::v1::ManifestBody& body) {
    auto manifest = ts::sidecar::SignManifest(key, body);
    TS_CHECK(manifest.ok());
    const std::string bytes = manifest->SerializeAsString();
    TS_CHECK(ts::sidecar::VerifyManifestBytes(bytes, "gonka-devnet", 1, "").ok());
    Write(dir, name, bytes);
  };
  write_manifest(
      "manifest_checkpoint",
      body_of({{"config.json", "{\"layers\": 2}"},
               {"weights/layer0.bin", std::string(2 * ts::sidecar::kMinChunkSize + 7, 'w')}},
              "checkpoint", 2, ts::common::Sha256("parent")));
  write_manifest("manifest_empty_artifact", body_of({}, "data", 0, ""));
  write_manifest(
      "manifest_nested",
      body_of({{".hidden", ""}, {"a-b/c", "x"}, {"a/b/c/d.bin", "y"}, {"z", "z"}}, "eval", 9, ""));
  Write(dir, "name_valid", "weights/layer-0/shard_1+v=2@x,y.bin");
  Write(dir, "name_traversal", "a/../../etc/passwd");
  Write(dir, "name_encoded", "a%2f..%2fb");
}

// A hello (or ack) from member `from` to member `to` of the fuzz target's fixed group, signed
// as SignPeerRequest signs but with a fixed nonce and the target's fixed time, and checked to
// verify as the target verifies it.
std::string SignedCollectiveHello(size_t from, size_t to, bool ack) {
  namespace pb = gonka::trainshard::v1;
  const ts::sidecar::GroupSpec& group = ts::fuzz::CollectiveGroup();
  const std::string_view method =
      ack ? ts::sidecar::kCollectiveHelloAckMethod : ts::sidecar::kCollectiveHelloMethod;
  pb::CollectiveHello hello;
  hello.set_shard_id(group.shard_id);
  hello.set_mesh_id(ts::fuzz::CollectiveMeshId());
  hello.set_member_index(static_cast<uint32_t>(from));
  if (ack) hello.set_answers_nonce(std::string(16, '\x5a'));
  pb::PeerRequestAuth* auth = hello.mutable_auth();
  auth->set_signer(group.members[from].address);
  auth->set_audience(group.members[to].address);
  auth->set_issued_unix_ms(ts::fuzz::kCollectiveNowUnixMs);
  auth->set_expires_unix_ms(ts::fuzz::kCollectiveNowUnixMs + 30000);
  auth->set_nonce(std::string(16, static_cast<char>(ack ? 0xa2 : 0xa1)));
  pb::PeerRequestStatement statement;
  statement.set_method(std::string(method));
  statement.set_signer(auth->signer());
  statement.set_audience(auth->audience());
  statement.set_expires_unix_ms(auth->expires_unix_ms());
  statement.set_nonce(auth->nonce());
  statement.set_body_sha256(ts::common::Sha256(ts::sidecar::RequestBodyBytes(hello)));
  statement.set_issued_unix_ms(auth->issued_unix_ms());
  auto signature = ts::common::SignStatement(
      ts::fuzz::CollectiveKey(from), ts::sidecar::kPeerRequestSignKind,
      ts::fuzz::kCollectiveChainId, group.shard_id, ts::DeterministicBytes(statement));
  TS_CHECK(signature.ok());
  auth->set_signature(*signature);

  ts::fuzz::FixedClock clock;
  ts::sidecar::PeerRequestVerifier verifier(group.members[to].address,
                                            std::string(ts::fuzz::kCollectiveChainId), &clock);
  auto signer = verifier.AuthenticateRequest(hello, method, group.shard_id);
  TS_CHECK(signer.ok() && *signer == group.members[from].address);
  if (!ack) {
    TS_CHECK(ts::sidecar::CheckHelloMember(hello, *signer, group, ts::fuzz::CollectiveMeshId(), to)
                 .ok());
  }
  return hello.SerializeAsString();
}

std::string CollectiveFrame(uint8_t mode, ts::sidecar::FrameType type, std::string_view payload,
                            uint32_t step = 0, uint32_t chunk = 0) {
  ts::sidecar::FrameHeader header;
  header.type = type;
  header.op_id = 7;
  header.step = step;
  header.chunk = chunk;
  header.payload_size = static_cast<uint32_t>(payload.size());
  return std::string(1, static_cast<char>(mode)) + ts::sidecar::EncodeFrameHeader(header) +
         std::string(payload);
}

// Frames, aborts, hellos and codec payloads as the collective sends them.
void WriteCollectiveFrameSeeds(const fs::path& dir) {
  using ts::sidecar::Compression;
  using ts::sidecar::FrameType;
  const std::string hello =
      SignedCollectiveHello(ts::fuzz::kCollectiveDialer, ts::fuzz::kCollectiveListener, false);
  const std::string ack =
      SignedCollectiveHello(ts::fuzz::kCollectiveListener, ts::fuzz::kCollectiveDialer, true);
  Write(dir, "frame_hello", CollectiveFrame(ts::fuzz::kModeFrame, FrameType::kHello, hello));
  Write(dir, "frame_ack", CollectiveFrame(ts::fuzz::kModeFrame, FrameType::kHelloAck, ack));
  Write(dir, "hello", std::string(1, ts::fuzz::kModeHello) + hello);
  Write(dir, "frame_heartbeat", CollectiveFrame(ts::fuzz::kModeFrame, FrameType::kHeartbeat, ""));
  Write(dir, "frame_close", CollectiveFrame(ts::fuzz::kModeFrame, FrameType::kClose, ""));
  const std::string abort = ts::sidecar::EncodeAbort(ts::fuzz::CollectiveGroup().members[2].address,
                                                     "no frame or heartbeat for 450 ms");
  Write(dir, "frame_abort", CollectiveFrame(ts::fuzz::kModeFrame, FrameType::kAbort, abort));
  Write(dir, "abort", std::string(1, ts::fuzz::kModeAbort) + abort);
  Write(dir, "abort_utf8",
        std::string(1, ts::fuzz::kModeAbort) +
            ts::sidecar::EncodeAbort("", "op 3: größe — 12 bytes"));

  std::vector<float> x(300);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<float>(static_cast<int>((i * 37) % 101) - 50) / 16.0f;
  }
  struct Codec {
    const char* name;
    ts::sidecar::CodecSpec spec;
  };
  const std::vector<Codec> codecs = {
      {"fp32", {Compression::kFp32, 4096, 64, 2}},
      {"fp16", {Compression::kFp16, 4096, 64, 2}},
      {"bf16", {Compression::kBf16, 4096, 64, 2}},
      {"int8", {Compression::kInt8, 128, 64, 2}},
      {"topk", {Compression::kTopK, 128, 8, 2}},
      {"topk_4bit", {Compression::kTopK, 64, 16, 4}},
      {"int8_zstd", {Compression::kInt8Zstd, 128, 64, 2}},
      {"fp32_zstd", {Compression::kFp32Zstd, 4096, 64, 2}},
  };
  for (const Codec& c : codecs) {
    std::string bytes;
    TS_CHECK(ts::sidecar::Encode(c.spec, x, &bytes).ok());
    TS_CHECK(ts::sidecar::IsEncodedSize(c.spec, x.size(), bytes.size()));
    Write(dir, std::string("codec_") + c.name,
          std::string(1, ts::fuzz::kModeCodec) +
              ts::fuzz::SerializeCodecInput(c.spec, x.size(), bytes));
    Write(dir, std::string("frame_data_") + c.name,
          CollectiveFrame(ts::fuzz::kModeFrame, FrameType::kData, bytes,
                          ts::fuzz::StepOfCodec(c.spec, x.size()), ts::fuzz::ChunkOfCodec(c.spec)));
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  const fs::path root(argv[1]);
  WriteTxSeeds(root / "fuzz_tx_decode");
  WriteSignBytesSeeds(root / "fuzz_sign_bytes");
  WriteAddressSeeds(root / "fuzz_address");
  WriteManifestSeeds(root / "fuzz_manifest");
  WriteCollectiveFrameSeeds(root / "fuzz_collective_frame");
  return 0;
}
