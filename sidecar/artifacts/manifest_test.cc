#include "sidecar/artifacts/manifest.h"

#include <cstdio>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/crypto/bech32.h"
#include "common/crypto/hash.h"
#include "common/crypto/secp256k1.h"
#include "common/crypto/signing.h"
#include "common/hex.h"
#include "google/protobuf/unknown_field_set.h"
#include "gtest/gtest.h"

namespace ts::sidecar {
namespace {

using common::Sha256;

constexpr char kChain[] = "gonka-test";
constexpr uint64_t kShard = 7;

std::string Msg(const absl::Status& status) { return std::string(status.message()); }

common::PrivateKey Key(char fill) {
  auto key = common::PrivateKey::FromBytes(std::string(32, fill));
  EXPECT_TRUE(key.ok());
  return *std::move(key);
}

std::string Address(const common::PrivateKey& key) {
  return common::AddressFromPublicKey(key.public_key());
}

// The test's own Merkle construction, written from the definition in docs/artifacts.md and not
// from the code under test.
std::string Leaf(const std::string& h) { return Sha256(std::string(1, '\x00') + h); }
std::string Node(const std::string& l, const std::string& r) {
  return Sha256(std::string(1, '\x01') + l + r);
}

std::string Fill(size_t n, char c) { return std::string(n, c); }

// A file of the artifact: its name and its bytes.
struct TestFile {
  std::string name;
  std::string data;
};

// A body describing `files` (in the given order) with chunk hashes computed directly.
pb::ManifestBody BodyOf(const std::vector<TestFile>& files, uint32_t chunk_size = kMinChunkSize,
                        const std::string& publisher = "") {
  pb::ManifestBody body;
  body.set_version(kManifestVersion);
  body.set_chain_id(kChain);
  body.set_shard_id(kShard);
  body.set_round(3);
  body.set_parent(Fill(32, '\x11'));
  body.set_publisher(publisher);
  body.set_kind("checkpoint");
  body.set_chunk_size(chunk_size);
  for (const TestFile& f : files) {
    pb::ManifestFile* file = body.add_files();
    file->set_name(f.name);
    file->set_size(f.data.size());
    for (size_t off = 0; off < f.data.size(); off += chunk_size) {
      file->add_chunks(Sha256(f.data.substr(off, chunk_size)));
    }
  }
  return body;
}

// Fills every file root and files_root (as SignManifest does), for bodies built to be checked
// directly.
void FillRoots(pb::ManifestBody* body) {
  std::vector<std::string> roots;
  for (pb::ManifestFile& file : *body->mutable_files()) {
    file.set_root(MerkleRoot({file.chunks().begin(), file.chunks().end()}));
    roots.push_back(file.root());
  }
  body->set_files_root(MerkleRoot(roots));
}

std::vector<TestFile> SampleFiles() {
  return {
      {"config.json", "{\"layers\": 2}"},
      {"empty", ""},
      {"weights/layer0.bin", Fill(kMinChunkSize * 2 + 100, 'a')},
      {"weights/layer1.bin", Fill(kMinChunkSize * 3, 'b')},
  };
}

// A signed manifest over arbitrary body bytes, so non-canonical bodies reach every check after
// the canonical one only if that one is missing.
pb::Manifest SignRaw(const common::PrivateKey& key, const std::string& body_bytes,
                     std::string_view chain_id = kChain, uint64_t shard_id = kShard) {
  auto sig =
      common::SignStatement(key, kArtifactSignKind, chain_id, shard_id, ArtifactId(body_bytes));
  EXPECT_TRUE(sig.ok()) << sig.status();
  pb::Manifest manifest;
  manifest.set_body(body_bytes);
  manifest.set_signature(*sig);
  return manifest;
}

absl::Status Verify(const pb::Manifest& manifest, std::string_view expected_id = "") {
  return VerifyManifest(manifest, kChain, kShard, expected_id).status();
}

// ---------------------------------------------------------------------------------------------
// Merkle roots and ids

TEST(MerkleRootTest, MatchesIndependentConstruction) {
  std::vector<std::string> h;
  for (int i = 0; i < 8; ++i) h.push_back(Sha256("chunk " + std::to_string(i)));
  auto first = [&](size_t n) { return std::vector<std::string>(h.begin(), h.begin() + n); };

  EXPECT_EQ(MerkleRoot({}), Sha256(""));
  EXPECT_EQ(common::HexEncode(MerkleRoot({})),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(MerkleRoot(first(1)), Leaf(h[0]));
  EXPECT_EQ(MerkleRoot(first(2)), Node(Leaf(h[0]), Leaf(h[1])));
  EXPECT_EQ(MerkleRoot(first(3)), Node(Node(Leaf(h[0]), Leaf(h[1])), Leaf(h[2])));
  EXPECT_EQ(MerkleRoot(first(4)), Node(Node(Leaf(h[0]), Leaf(h[1])), Node(Leaf(h[2]), Leaf(h[3]))));
  EXPECT_EQ(MerkleRoot(first(5)),
            Node(Node(Node(Leaf(h[0]), Leaf(h[1])), Node(Leaf(h[2]), Leaf(h[3]))), Leaf(h[4])));
  // 7 = 4 + 3: the right subtree is itself split 2 + 1.
  EXPECT_EQ(MerkleRoot(first(7)),
            Node(Node(Node(Leaf(h[0]), Leaf(h[1])), Node(Leaf(h[2]), Leaf(h[3]))),
                 Node(Node(Leaf(h[4]), Leaf(h[5])), Leaf(h[6]))));
  // A leaf is not its own root: the second-preimage guard of the 0x00/0x01 prefixes.
  EXPECT_NE(MerkleRoot(first(1)), h[0]);
  // Order matters.
  EXPECT_NE(MerkleRoot({h[1], h[0]}), MerkleRoot(first(2)));
}

TEST(ArtifactIdTest, IsTheDomainSeparatedHashOfTheBody) {
  const std::string body = "some body bytes";
  EXPECT_EQ(ArtifactId(body),
            Sha256(std::string("gonka-trainshard/v1/artifact-manifest") + '\0' + body));
  EXPECT_NE(ArtifactId(body), Sha256(body));
}

TEST(ParseArtifactIdTest, ParsesEitherCaseAndRefusesTheRest) {
  const std::string id = Sha256("x");
  auto lower = ParseArtifactId("--id", common::HexEncode(id));
  ASSERT_TRUE(lower.ok()) << lower.status();
  EXPECT_EQ(*lower, id);
  auto upper = ParseArtifactId("--id", common::HexEncodeUpper(id));
  ASSERT_TRUE(upper.ok());
  EXPECT_EQ(*upper, id);
  for (const std::string& bad :
       {std::string(""), common::HexEncode(id).substr(2), common::HexEncode(id) + "00",
        std::string(63, 'a') + "g", std::string(64, 'z')}) {
    absl::Status status = ParseArtifactId("--id", bad).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(Msg(status).find("--id: "), std::string::npos) << status;
  }
}

// ---------------------------------------------------------------------------------------------
// Signing and verification

TEST(ManifestTest, SignAndVerifyRoundTrip) {
  const common::PrivateKey key = Key('\x01');
  pb::ManifestBody body = BodyOf(SampleFiles());
  auto manifest = SignManifest(key, body);
  ASSERT_TRUE(manifest.ok()) << manifest.status();

  auto verified = VerifyManifest(*manifest, kChain, kShard, "");
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_EQ(verified->id, ArtifactId(manifest->body()));
  EXPECT_EQ(verified->id.size(), 32u);
  EXPECT_EQ(verified->body.publisher(), Address(key));  // filled in from the key
  EXPECT_EQ(verified->body.version(), kManifestVersion);
  EXPECT_EQ(verified->body.files_size(), 4);
  EXPECT_EQ(verified->total_bytes, 13u + 0 + (kMinChunkSize * 2 + 100) + kMinChunkSize * 3);
  EXPECT_EQ(verified->total_chunks, 1u + 0 + 3 + 3);
  EXPECT_EQ(verified->manifest.SerializeAsString(), manifest->SerializeAsString());

  // The roots are those of the independent construction.
  const pb::ManifestFile& layer1 = verified->body.files(3);
  const std::string cb = Sha256(Fill(kMinChunkSize, 'b'));
  EXPECT_EQ(layer1.root(), Node(Node(Leaf(cb), Leaf(cb)), Leaf(cb)));
  EXPECT_EQ(verified->body.files(1).root(), Sha256(""));
  std::vector<std::string> roots;
  for (const auto& f : verified->body.files()) roots.push_back(f.root());
  EXPECT_EQ(verified->body.files_root(),
            Node(Node(Leaf(roots[0]), Leaf(roots[1])), Node(Leaf(roots[2]), Leaf(roots[3]))));

  // The body bytes are the canonical encoding, and the signature is the statement signature.
  EXPECT_EQ(manifest->body(), EncodeManifestBody(verified->body));
  auto signer = common::RecoverStatementSigner("artifact", kChain, kShard, verified->id,
                                               manifest->signature());
  ASSERT_TRUE(signer.ok());
  EXPECT_EQ(*signer, Address(key));

  // With the expected id, and from bytes.
  EXPECT_TRUE(Verify(*manifest, verified->id).ok());
  auto from_bytes =
      VerifyManifestBytes(manifest->SerializeAsString(), kChain, kShard, verified->id);
  ASSERT_TRUE(from_bytes.ok()) << from_bytes.status();
  EXPECT_EQ(from_bytes->id, verified->id);
  EXPECT_EQ(from_bytes->total_bytes, verified->total_bytes);

  // Signing is deterministic: same body, same manifest.
  auto again = SignManifest(key, body);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->SerializeAsString(), manifest->SerializeAsString());
}

TEST(ManifestTest, EmptyArtifactAndDefaultChunkSize) {
  const common::PrivateKey key = Key('\x01');
  auto manifest = SignManifest(key, BodyOf({}, kDefaultChunkSize));
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  auto verified = VerifyManifest(*manifest, kChain, kShard, "");
  ASSERT_TRUE(verified.ok()) << verified.status();
  EXPECT_EQ(verified->body.files_root(), Sha256(""));
  EXPECT_EQ(verified->total_bytes, 0u);
  EXPECT_EQ(verified->total_chunks, 0u);
}

TEST(ManifestTest, SignRefusesAPublisherThatIsNotTheKey) {
  const common::PrivateKey key = Key('\x01');
  pb::ManifestBody body = BodyOf(SampleFiles(), kMinChunkSize, Address(Key('\x02')));
  absl::Status status = SignManifest(key, body).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(Msg(status).find("publisher"), std::string::npos) << status;
  // With its own address it signs.
  body.set_publisher(Address(key));
  EXPECT_TRUE(SignManifest(key, body).ok());
}

TEST(ManifestTest, SignRefusesWhatCheckRefuses) {
  const common::PrivateKey key = Key('\x01');
  pb::ManifestBody body = BodyOf({{"b", "1"}, {"a", "2"}});
  absl::Status status = SignManifest(key, body).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(Msg(status).find("files[1].name"), std::string::npos) << status;
  // A wrong root set by the caller is reported, not silently replaced.
  body = BodyOf({{"a", "2"}});
  body.mutable_files(0)->set_root(Fill(32, '\x00'));
  status = SignManifest(key, body).status();
  EXPECT_NE(Msg(status).find("files[0].root"), std::string::npos) << status;
}

TEST(ManifestTest, TamperedBodyIsRefused) {
  const common::PrivateKey key = Key('\x01');
  auto manifest = SignManifest(key, BodyOf(SampleFiles()));
  ASSERT_TRUE(manifest.ok());
  pb::ManifestBody body;
  ASSERT_TRUE(body.ParseFromString(manifest->body()));

  // A consistent body (roots recomputed) with another round: the signature no longer matches.
  body.set_round(99);
  pb::Manifest tampered = *manifest;
  tampered.set_body(EncodeManifestBody(body));
  absl::Status status = Verify(tampered);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
  EXPECT_NE(Msg(status).find("not by the publisher"), std::string::npos) << status;

  // A chunk hash replaced, roots left alone: the recomputed root catches it.
  ASSERT_TRUE(body.ParseFromString(manifest->body()));
  body.mutable_files(2)->set_chunks(1, Sha256("evil"));
  tampered.set_body(EncodeManifestBody(body));
  status = Verify(tampered);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(Msg(status).find("files[2].root"), std::string::npos) << status;

  // The same with the file root fixed up: files_root catches it.
  FillRoots(&body);
  body.set_files_root(Fill(32, '\x42'));
  tampered.set_body(EncodeManifestBody(body));
  status = Verify(tampered);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(Msg(status).find("files_root"), std::string::npos) << status;

  // Every root consistent: only the signature is left to catch it.
  FillRoots(&body);
  tampered.set_body(EncodeManifestBody(body));
  EXPECT_EQ(Verify(tampered).code(), absl::StatusCode::kUnauthenticated);

  // A flipped byte anywhere in the body is refused one way or another.
  for (size_t i = 0; i < manifest->body().size(); i += 7) {
    pb::Manifest flipped = *manifest;
    std::string bytes = manifest->body();
    bytes[i] = static_cast<char>(bytes[i] ^ 0x01);
    flipped.set_body(bytes);
    EXPECT_FALSE(Verify(flipped).ok()) << "byte " << i;
  }
}

TEST(ManifestTest, WrongIdChainOrShardIsRefused) {
  const common::PrivateKey key = Key('\x01');
  auto manifest = SignManifest(key, BodyOf(SampleFiles()));
  ASSERT_TRUE(manifest.ok());
  const std::string id = ArtifactId(manifest->body());

  absl::Status status = Verify(*manifest, Sha256("another artifact"));
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(Msg(status).find(common::HexEncode(id)), std::string::npos) << status;

  status = VerifyManifest(*manifest, "gonka-other", kShard, id).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  EXPECT_NE(Msg(status).find("chain_id"), std::string::npos) << status;

  status = VerifyManifest(*manifest, kChain, kShard + 1, id).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied) << status;
  EXPECT_NE(Msg(status).find("shard_id"), std::string::npos) << status;
}

TEST(ManifestTest, ForgedSignatureIsRefused) {
  const common::PrivateKey publisher = Key('\x01');
  const common::PrivateKey forger = Key('\x02');
  pb::ManifestBody body = BodyOf(SampleFiles(), kMinChunkSize, Address(publisher));
  body.set_version(kManifestVersion);
  FillRoots(&body);
  ASSERT_TRUE(CheckManifestBody(body).ok()) << CheckManifestBody(body);
  const std::string bytes = EncodeManifestBody(body);

  // Control: the publisher's own signature passes.
  ASSERT_TRUE(Verify(SignRaw(publisher, bytes)).ok());

  absl::Status status = Verify(SignRaw(forger, bytes));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << status;
  EXPECT_NE(Msg(status).find(Address(forger)), std::string::npos) << status;

  // The publisher's signature for another shard or chain does not carry over.
  EXPECT_EQ(Verify(SignRaw(publisher, bytes, kChain, kShard + 1)).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Verify(SignRaw(publisher, bytes, "gonka-other", kShard)).code(),
            absl::StatusCode::kUnauthenticated);

  pb::Manifest unsigned_manifest = SignRaw(publisher, bytes);
  unsigned_manifest.clear_signature();
  EXPECT_EQ(Verify(unsigned_manifest).code(), absl::StatusCode::kUnauthenticated);
  pb::Manifest garbage = SignRaw(publisher, bytes);
  garbage.set_signature(Fill(65, '\x07'));
  EXPECT_EQ(Verify(garbage).code(), absl::StatusCode::kUnauthenticated);
  garbage.set_signature(Fill(64, '\x07'));
  EXPECT_EQ(Verify(garbage).code(), absl::StatusCode::kUnauthenticated);
}

// ---------------------------------------------------------------------------------------------
// Canonical encoding

class CanonicalTest : public ::testing::Test {
 protected:
  pb::ManifestBody Body() {
    pb::ManifestBody body = BodyOf(SampleFiles(), kMinChunkSize, Address(key_));
    FillRoots(&body);
    return body;
  }
  const common::PrivateKey key_ = Key('\x01');
};

TEST_F(CanonicalTest, UnknownTopLevelFieldIsRefused) {
  const std::string canonical = EncodeManifestBody(Body());
  // Field 99, varint 1, appended: still parses, and would survive re-encoding.
  const std::string bytes = canonical + std::string("\x98\x06\x01", 3);
  pb::ManifestBody parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  absl::Status status = Verify(SignRaw(key_, bytes));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(Msg(status).find("not canonical"), std::string::npos) << status;
}

TEST_F(CanonicalTest, UnknownNestedFieldIsRefused) {
  pb::ManifestBody body = Body();
  pb::ManifestFile* file = body.mutable_files(1);
  file->GetReflection()->MutableUnknownFields(file)->AddVarint(77, 5);
  const std::string bytes = EncodeManifestBody(body);
  absl::Status status = Verify(SignRaw(key_, bytes));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(Msg(status).find("not canonical"), std::string::npos) << status;
}

TEST_F(CanonicalTest, FieldsOutOfOrderOrDefaultsWrittenAreRefused) {
  const std::string canonical = EncodeManifestBody(Body());
  // The same message with an explicit `round` written again at the end (last one wins): parses
  // to the same body, different bytes.
  const std::string repeated_round = canonical + std::string("\x20\x03", 2);
  pb::ManifestBody parsed;
  ASSERT_TRUE(parsed.ParseFromString(repeated_round));
  EXPECT_EQ(EncodeManifestBody(parsed), canonical);
  absl::Status status = Verify(SignRaw(key_, repeated_round));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(Msg(status).find("not canonical"), std::string::npos) << status;

  // A zero written explicitly for a field proto3 omits when zero.
  pb::ManifestBody body = Body();
  body.set_round(0);
  const std::string zero_round = EncodeManifestBody(body) + std::string("\x20\x00", 2);
  EXPECT_EQ(Verify(SignRaw(key_, zero_round)).code(), absl::StatusCode::kInvalidArgument);

  // Control: the canonical bytes, signed the same way, pass.
  EXPECT_TRUE(Verify(SignRaw(key_, canonical)).ok());
}

TEST_F(CanonicalTest, UnsortedOrDuplicateFilesAreRefused) {
  pb::ManifestBody body = BodyOf({{"b", "1"}, {"a", "2"}}, kMinChunkSize, Address(key_));
  FillRoots(&body);
  absl::Status status = Verify(SignRaw(key_, EncodeManifestBody(body)));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(Msg(status).find("files[1].name"), std::string::npos) << status;
  EXPECT_NE(Msg(status).find("sorted"), std::string::npos) << status;

  body = BodyOf({{"a", "1"}, {"a", "2"}}, kMinChunkSize, Address(key_));
  FillRoots(&body);
  status = Verify(SignRaw(key_, EncodeManifestBody(body)));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(Msg(status).find("appears twice"), std::string::npos) << status;
}

TEST_F(CanonicalTest, GarbageBodyIsRefused) {
  pb::Manifest manifest = SignRaw(key_, "\xff\xff\xff");
  absl::Status status = Verify(manifest);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(Msg(status).find("does not parse"), std::string::npos) << status;
  status = VerifyManifestBytes("\x0a\xff\xff\xff\x0f", kChain, kShard, "").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  // An empty body parses to an empty message, which fails the structural checks.
  EXPECT_EQ(Verify(SignRaw(key_, "")).code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// Structural checks

TEST(CheckManifestBodyTest, AcceptsAValidBody) {
  pb::ManifestBody body = BodyOf(SampleFiles(), kMinChunkSize, "gonka1publisher");
  FillRoots(&body);
  EXPECT_TRUE(CheckManifestBody(body).ok()) << CheckManifestBody(body);
  body.clear_parent();
  EXPECT_TRUE(CheckManifestBody(body).ok());
  body.set_chunk_size(kMaxChunkSize);  // the sample's files fit in one chunk each now
  for (pb::ManifestFile& f : *body.mutable_files()) {
    if (f.size() > 0) {
      f.clear_chunks();
      f.add_chunks(Sha256(f.name()));
    }
  }
  FillRoots(&body);
  EXPECT_TRUE(CheckManifestBody(body).ok()) << CheckManifestBody(body);
}

struct BadBody {
  std::string label;
  std::function<void(pb::ManifestBody*)> mutate;
  bool refill_roots;
  std::string field;  // a substring of the message
};

class CheckManifestBodyBadTest : public ::testing::TestWithParam<BadBody> {};

TEST_P(CheckManifestBodyBadTest, IsInvalidArgumentNamingTheField) {
  const BadBody& c = GetParam();
  pb::ManifestBody body = BodyOf(SampleFiles(), kMinChunkSize, "gonka1publisher");
  FillRoots(&body);
  ASSERT_TRUE(CheckManifestBody(body).ok());
  c.mutate(&body);
  if (c.refill_roots) FillRoots(&body);
  absl::Status status = CheckManifestBody(body);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.label << ": " << status;
  EXPECT_NE(Msg(status).find(c.field), std::string::npos) << c.label << ": " << status;
}

pb::ManifestFile* InsertFile(pb::ManifestBody* body, int index, const std::string& name,
                             const std::string& data) {
  pb::ManifestFile file;
  file.set_name(name);
  file.set_size(data.size());
  for (size_t off = 0; off < data.size(); off += body->chunk_size()) {
    file.add_chunks(Sha256(data.substr(off, body->chunk_size())));
  }
  auto* files = body->mutable_files();
  files->Add(std::move(file));
  for (int i = files->size() - 1; i > index; --i) files->SwapElements(i, i - 1);
  return files->Mutable(index);
}

std::vector<BadBody> BadBodies() {
  return {
      {"version_0", [](pb::ManifestBody* b) { b->set_version(0); }, false, "version: 0"},
      {"version_2", [](pb::ManifestBody* b) { b->set_version(2); }, false, "version: 2"},
      {"empty_chain", [](pb::ManifestBody* b) { b->clear_chain_id(); }, false, "chain_id"},
      {"long_chain", [](pb::ManifestBody* b) { b->set_chain_id(Fill(65, 'c')); }, false,
       "chain_id"},
      {"empty_kind", [](pb::ManifestBody* b) { b->clear_kind(); }, false, "kind"},
      {"upper_kind", [](pb::ManifestBody* b) { b->set_kind("Checkpoint"); }, false,
       "kind: \"Checkpoint\""},
      {"kind_slash", [](pb::ManifestBody* b) { b->set_kind("a/b"); }, false, "kind"},
      {"long_kind", [](pb::ManifestBody* b) { b->set_kind(Fill(33, 'k')); }, false, "kind"},
      {"short_parent", [](pb::ManifestBody* b) { b->set_parent(Fill(31, 'p')); }, false,
       "parent: 31 bytes"},
      {"empty_publisher", [](pb::ManifestBody* b) { b->clear_publisher(); }, false, "publisher"},
      {"small_chunk", [](pb::ManifestBody* b) { b->set_chunk_size(kMinChunkSize - 1); }, false,
       "chunk_size: 4095"},
      {"big_chunk", [](pb::ManifestBody* b) { b->set_chunk_size(kMaxChunkSize + 1); }, false,
       "chunk_size"},
      {"zero_chunk", [](pb::ManifestBody* b) { b->set_chunk_size(0); }, false, "chunk_size: 0"},
      {"traversal_name", [](pb::ManifestBody* b) { InsertFile(b, 0, "../evil", "x"); }, true,
       "files[0].name: \"../evil\""},
      {"absolute_name", [](pb::ManifestBody* b) { InsertFile(b, 0, "/etc/passwd", "x"); }, true,
       "files[0].name"},
      {"backslash_name", [](pb::ManifestBody* b) { InsertFile(b, 2, "c\\d", "x"); }, true,
       "files[2].name"},
      {"nul_name", [](pb::ManifestBody* b) { InsertFile(b, 2, std::string("c\0d", 3), "x"); }, true,
       "files[2].name"},
      {"encoded_name", [](pb::ManifestBody* b) { InsertFile(b, 2, "d%2f..%2fx", "x"); }, true,
       "files[2].name"},
      {"empty_name", [](pb::ManifestBody* b) { InsertFile(b, 0, "", "x"); }, true, "files[0].name"},
      {"unsorted", [](pb::ManifestBody* b) { b->mutable_files()->SwapElements(0, 1); }, true,
       "files[1].name"},
      {"duplicate", [](pb::ManifestBody* b) { InsertFile(b, 1, "config.json", "y"); }, true,
       "files[1].name: \"config.json\" appears twice"},
      {"file_and_dir",
       [](pb::ManifestBody* b) {
         b->mutable_files(0)->set_name("a");
         InsertFile(b, 1, "a/b", "x");
       },
       true, "files[1].name: \"a/b\" is inside \"a\""},
      {"file_and_dir_not_adjacent",
       [](pb::ManifestBody* b) {
         // "weights" < "weights-x" < "weights.y" < "weights/layer0.bin": the clash is two
         // entries apart in sorted order.
         InsertFile(b, 2, "weights", "w");
         InsertFile(b, 3, "weights-x", "w");
         InsertFile(b, 4, "weights.y", "w");
       },
       true, "files[5].name: \"weights/layer0.bin\" is inside \"weights\""},
      {"too_few_chunks",
       [](pb::ManifestBody* b) { b->mutable_files(2)->mutable_chunks()->RemoveLast(); }, true,
       "files[2].chunks: 2 chunks, but size 8292 with chunk_size 4096 needs 3"},
      {"too_many_chunks",
       [](pb::ManifestBody* b) { b->mutable_files(3)->add_chunks(Sha256("extra")); }, true,
       "files[3].chunks: 4 chunks"},
      {"chunk_for_empty_file",
       [](pb::ManifestBody* b) { b->mutable_files(1)->add_chunks(Sha256("")); }, true,
       "files[1].chunks: 1 chunks, but size 0"},
      {"size_grown", [](pb::ManifestBody* b) { b->mutable_files(3)->set_size(3 * 4096 + 1); }, true,
       "files[3].chunks"},
      {"size_shrunk", [](pb::ManifestBody* b) { b->mutable_files(3)->set_size(2 * 4096); }, true,
       "files[3].chunks"},
      {"huge_size", [](pb::ManifestBody* b) { b->mutable_files(3)->set_size(UINT64_MAX); }, true,
       "files[3].chunks"},
      {"short_chunk_hash",
       [](pb::ManifestBody* b) { b->mutable_files(2)->set_chunks(1, Fill(31, 'h')); }, true,
       "files[2].chunks[1]: 31 bytes"},
      {"long_chunk_hash",
       [](pb::ManifestBody* b) { b->mutable_files(3)->set_chunks(2, Fill(33, 'h')); }, true,
       "files[3].chunks[2]: 33 bytes"},
      {"wrong_file_root", [](pb::ManifestBody* b) { b->mutable_files(3)->set_root(Sha256("x")); },
       false, "files[3].root"},
      {"short_file_root", [](pb::ManifestBody* b) { b->mutable_files(0)->set_root(Fill(5, 'r')); },
       false, "files[0].root: 5 bytes"},
      {"chunk_swapped_root_stale",
       [](pb::ManifestBody* b) { b->mutable_files(2)->mutable_chunks()->SwapElements(0, 2); },
       false, "files[2].root"},
      {"wrong_files_root", [](pb::ManifestBody* b) { b->set_files_root(Sha256("x")); }, false,
       "files_root"},
      {"empty_files_root", [](pb::ManifestBody* b) { b->clear_files_root(); }, false, "files_root"},
  };
}

INSTANTIATE_TEST_SUITE_P(Bodies, CheckManifestBodyBadTest, ::testing::ValuesIn(BadBodies()),
                         [](const ::testing::TestParamInfo<BadBody>& info) {
                           return info.param.label;
                         });

TEST(CheckManifestBodyTest, NamesTheChunkIndexInTheThirdFile) {
  pb::ManifestBody body = BodyOf({{"a", "1"}, {"b", "2"}, {"c", Fill(kMinChunkSize * 7, 'c')}},
                                 kMinChunkSize, "gonka1publisher");
  body.mutable_files(2)->set_chunks(5, "short");
  FillRoots(&body);
  absl::Status status = CheckManifestBody(body);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(Msg(status).find("files[2].chunks[5]: 5 bytes, want 32"), std::string::npos) << status;
}

TEST(CheckManifestBodyTest, TooManyFiles) {
  pb::ManifestBody body = BodyOf({}, kMinChunkSize, "gonka1publisher");
  for (size_t i = 0; i <= kMaxManifestFiles; ++i) {
    char name[16];
    std::snprintf(name, sizeof(name), "f%07zu", i);
    body.add_files()->set_name(name);
  }
  FillRoots(&body);
  absl::Status status = CheckManifestBody(body);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(Msg(status).find("files: 100001 files"), std::string::npos) << status;
  // One fewer is within the cap.
  body.mutable_files()->RemoveLast();
  FillRoots(&body);
  EXPECT_TRUE(CheckManifestBody(body).ok()) << CheckManifestBody(body);
}

TEST(CheckManifestBodyTest, TooManyChunks) {
  pb::ManifestBody body = BodyOf({}, kMinChunkSize, "gonka1publisher");
  const std::string hash = Sha256("c");
  // Two files, each within the cap alone, over it together.
  for (const char* name : {"a", "b"}) {
    pb::ManifestFile* file = body.add_files();
    file->set_name(name);
    const size_t chunks = kMaxManifestChunks / 2 + 1;
    file->set_size(uint64_t{chunks} * kMinChunkSize);
    for (size_t i = 0; i < chunks; ++i) file->add_chunks(hash);
    // The cap is checked before any root is recomputed, so a placeholder root will do.
    file->set_root(hash);
  }
  body.set_files_root(hash);
  absl::Status status = CheckManifestBody(body);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(Msg(status).find("more than 400000 chunks"), std::string::npos) << status;
  EXPECT_NE(Msg(status).find("files[1]"), std::string::npos) << status;
}

TEST(ManifestSizeTest, OversizedManifestIsRefusedBeforeParsing) {
  // Bytes that would not even parse: the size check must come first to give RESOURCE_EXHAUSTED.
  const std::string huge(kMaxManifestBytes + 1, '\xff');
  absl::Status status = VerifyManifestBytes(huge, kChain, kShard, "").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  // At the cap itself, the same garbage is a parse error instead.
  status =
      VerifyManifestBytes(std::string_view(huge).substr(0, kMaxManifestBytes), kChain, kShard, "")
          .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;

  // A decoded manifest over the cap (its body a valid-looking blob) is refused too.
  pb::Manifest manifest;
  manifest.set_body(std::string(kMaxManifestBytes, 'x'));
  manifest.set_signature(Fill(65, 's'));
  status = VerifyManifest(manifest, kChain, kShard, "").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
}

TEST(EncodeManifestBodyTest, IsDeterministicAndFieldOrdered) {
  pb::ManifestBody body = BodyOf(SampleFiles(), kMinChunkSize, "gonka1publisher");
  FillRoots(&body);
  const std::string a = EncodeManifestBody(body);
  pb::ManifestBody copy;
  ASSERT_TRUE(copy.ParseFromString(a));
  EXPECT_EQ(EncodeManifestBody(copy), a);
  // Field 1 (version = 1) comes first.
  ASSERT_GE(a.size(), 2u);
  EXPECT_EQ(a[0], '\x08');
  EXPECT_EQ(a[1], '\x01');
}

}  // namespace
}  // namespace ts::sidecar
