#include "sidecar/artifacts/chunk_wire.h"

#include <string>
#include <string_view>
#include <vector>

#include "gmock/gmock.h"
#include "gonka/trainshard/v1/shard.pb.h"
#include "gtest/gtest.h"

namespace ts::sidecar {
namespace {

namespace pb = ::gonka::trainshard::v1;
using ::testing::HasSubstr;

struct Decoded {
  absl::Status status;
  std::string hash;
  std::string data;
};

// Decodes `bytes` split at every position in `cuts`, with room for `capacity` data bytes.
Decoded Decode(std::string_view bytes, const std::vector<size_t>& cuts, size_t capacity) {
  std::vector<std::string_view> pieces;
  size_t at = 0;
  for (size_t cut : cuts) {
    pieces.push_back(bytes.substr(at, cut - at));
    at = cut;
  }
  pieces.push_back(bytes.substr(at));
  std::string buffer(capacity, '\0');
  size_t size = 0;
  Decoded out;
  out.status = DecodeChunkData(pieces, &out.hash, buffer.data(), capacity, &size);
  out.data = buffer.substr(0, size);
  return out;
}

std::string Encoded(std::string hash, std::string data) {
  pb::ChunkData message;
  message.set_hash(std::move(hash));
  message.set_data(std::move(data));
  return message.SerializeAsString();
}

TEST(ChunkWireTest, DecodesWhatProtobufEncodesWhereverTheMessageIsSplit) {
  const std::string hash(32, '\x5a');
  std::string data(5000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31);
  const std::string bytes = Encoded(hash, data);
  for (size_t cut : {size_t{0}, size_t{1}, size_t{2}, size_t{33}, size_t{34}, size_t{36},
                     size_t{1000}, bytes.size()}) {
    const Decoded got = Decode(bytes, {cut}, 8192);
    ASSERT_TRUE(got.status.ok()) << cut << ": " << got.status;
    EXPECT_EQ(got.hash, hash);
    EXPECT_EQ(got.data, data);
  }
  // Many one-byte pieces.
  std::vector<size_t> cuts;
  for (size_t i = 1; i < bytes.size(); i += 1) cuts.push_back(i);
  const Decoded got = Decode(bytes, cuts, 8192);
  ASSERT_TRUE(got.status.ok()) << got.status;
  EXPECT_EQ(got.data, data);
}

TEST(ChunkWireTest, SkipsUnknownFieldsAndKeepsTheLastValueLikeProtobuf) {
  std::string bytes = Encoded("first", "one");
  bytes += std::string("\x18\x96\x01", 3);                // field 3 varint 150
  bytes += std::string("\x21", 1) + std::string(8, 'x');  // field 4 fixed64
  bytes += std::string("\x2d", 1) + std::string(4, 'y');  // field 5 fixed32
  bytes += std::string("\x32\x02zz", 4);                  // field 6 bytes
  bytes += Encoded("second", "two");
  pb::ChunkData reference;
  ASSERT_TRUE(reference.ParseFromString(bytes));
  const Decoded got = Decode(bytes, {7}, 16);
  ASSERT_TRUE(got.status.ok()) << got.status;
  EXPECT_EQ(got.hash, reference.hash());
  EXPECT_EQ(got.data, reference.data());
}

TEST(ChunkWireTest, RefusesMalformedAnswers) {
  const std::string good = Encoded(std::string(32, 'h'), "data");
  struct Case {
    std::string bytes;
    size_t capacity;
    std::string message;
  };
  const std::vector<Case> cases = {
      {good.substr(0, good.size() - 1), 16, "field 2: 4 bytes, 3 left"},
      {std::string("\x0a", 1), 16, "truncated or oversized length"},
      // Tags and lengths longer than 5 bytes, though their values fit: protobuf refuses them.
      {std::string("\xa2\xa2\xa2\xa2\x89\x00\x00", 7), 16, "truncated or oversized field tag"},
      {std::string("\x0a\x80\x80\x80\x80\x80\x00", 7), 16, "truncated or oversized length"},
      {std::string("\x80", 1), 16, "truncated or oversized field tag"},
      {std::string("\x08\x01", 2), 16, "field 1 is not bytes"},
      {std::string("\x11", 1) + std::string(8, 'a'), 16, "field 2 is not bytes"},
      {std::string("\x13", 1), 16, "wire type 3 of field 2"},
      {std::string("\x02\x00", 2), 16, "field number 0"},
      {std::string("\x18\xff\xff", 3), 16, "truncated varint"},
      {Encoded(std::string(33, 'h'), "data"), 16, "hash: 33 bytes"},
      {good, 3, "data: 4 bytes, more than the chunk size 3"},
      {std::string("\x0a\xff\xff\xff\xff\x0f", 6), 16, "field 1: 4294967295 bytes, 0 left"},
  };
  for (const Case& c : cases) {
    const Decoded got = Decode(c.bytes, {}, c.capacity);
    EXPECT_EQ(got.status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(got.status.message()), HasSubstr(c.message));
  }
}

TEST(ChunkWireTest, EmptyMessageIsEmptyChunk) {
  const Decoded got = Decode("", {}, 16);
  ASSERT_TRUE(got.status.ok());
  EXPECT_EQ(got.hash, "");
  EXPECT_EQ(got.data, "");
}

}  // namespace
}  // namespace ts::sidecar
