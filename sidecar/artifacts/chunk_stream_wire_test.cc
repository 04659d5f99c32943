#include "sidecar/artifacts/chunk_stream_wire.h"
#include "sidecar/artifacts/chunk_stream.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace ts::sidecar {
namespace {

using ::testing::HasSubstr;

std::string ChunkHeader(uint32_t index, uint32_t size, const std::string& hash) {
  std::string out(kChunkStreamFrameHeaderBytes, '\0');
  EncodeChunkFrameHeader(index, size, hash, out.data());
  return out;
}

TEST(ChunkStreamWireTest, RequestHeaderRoundTripsAndRefusals) {
  const std::string header = EncodeChunkStreamRequestHeader(9000);
  ASSERT_EQ(header.size(), kChunkStreamRequestHeaderBytes);
  auto length = DecodeChunkStreamRequestHeader(header, 65536);
  ASSERT_TRUE(length.ok()) << length.status();
  EXPECT_EQ(*length, 9000u);

  EXPECT_THAT(DecodeChunkStreamRequestHeader(header.substr(1), 65536).status().message(),
              HasSubstr("11 bytes, want 12"));
  std::string bad = header;
  bad[0] = 'X';
  EXPECT_THAT(DecodeChunkStreamRequestHeader(bad, 65536).status().message(), HasSubstr("magic"));
  bad = header;
  bad[4] = 2;
  EXPECT_THAT(DecodeChunkStreamRequestHeader(bad, 65536).status().message(),
              HasSubstr("version 2, want 1"));
  bad = header;
  bad[6] = 1;
  EXPECT_THAT(DecodeChunkStreamRequestHeader(bad, 65536).status().message(), HasSubstr("reserved"));
  EXPECT_THAT(DecodeChunkStreamRequestHeader(header, 8999).status().message(),
              HasSubstr("length 9000 is outside 1..8999"));
  EXPECT_THAT(
      DecodeChunkStreamRequestHeader(EncodeChunkStreamRequestHeader(0), 65536).status().message(),
      HasSubstr("length 0"));
}

TEST(ChunkStreamWireTest, EndpointHost) {
  EXPECT_EQ(EndpointHost("10.0.0.1:7000"), "10.0.0.1");
  EXPECT_EQ(EndpointHost("[::1]:7000"), "::1");
  EXPECT_EQ(EndpointHost("node.example:1"), "node.example");
  EXPECT_EQ(EndpointHost("7000"), "");
  EXPECT_EQ(EndpointHost(":7000"), "");
}

TEST(ChunkStreamWireTest, FrameHeadersRoundTrip) {
  const std::string hash(32, 'h');
  auto chunk = DecodeChunkStreamFrameHeader(ChunkHeader(7, 4096, hash), 4096);
  ASSERT_TRUE(chunk.ok()) << chunk.status();
  EXPECT_EQ(chunk->type, ChunkStreamFrameType::kChunk);
  EXPECT_EQ(chunk->index, 7u);
  EXPECT_EQ(chunk->size, 4096u);
  EXPECT_EQ(chunk->hash, hash);

  std::string end(kChunkStreamFrameHeaderBytes, '\0');
  EncodeEndFrameHeader(12, end.data());
  auto ended = DecodeChunkStreamFrameHeader(end, 4096);
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(ended->type, ChunkStreamFrameType::kEnd);
  EXPECT_EQ(ended->index, 12u);

  const std::string error = EncodeErrorFrame(absl::PermissionDeniedError("not a member\n\x01"));
  auto frame = DecodeChunkStreamFrameHeader(error.substr(0, kChunkStreamFrameHeaderBytes), 4096);
  ASSERT_TRUE(frame.ok()) << frame.status();
  ASSERT_EQ(frame->type, ChunkStreamFrameType::kError);
  const absl::Status status =
      ChunkStreamErrorStatus(*frame, error.substr(kChunkStreamFrameHeaderBytes));
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(status.message(), "not a member??");  // control bytes do not reach the logs

  // A message longer than the cap is cut, not refused.
  const std::string long_error = EncodeErrorFrame(absl::InternalError(std::string(10000, 'e')));
  EXPECT_EQ(long_error.size(), kChunkStreamFrameHeaderBytes + kMaxChunkStreamErrorBytes);
}

TEST(ChunkStreamWireTest, MalformedFrameHeadersRefused) {
  const std::string hash(32, 'h');
  const std::string good = ChunkHeader(0, 100, hash);
  auto refused = [](const std::string& header, uint32_t cap = 4096) {
    return std::string(DecodeChunkStreamFrameHeader(header, cap).status().message());
  };
  EXPECT_THAT(refused(good.substr(0, 47)), HasSubstr("47 bytes, want 48"));
  std::string bad = good;
  bad[1] = 'x';
  EXPECT_THAT(refused(bad), HasSubstr("magic"));
  bad = good;
  bad[4] = 9;
  EXPECT_THAT(refused(bad), HasSubstr("type 9"));
  bad = good;
  bad[7] = 1;
  EXPECT_THAT(refused(bad), HasSubstr("reserved"));
  EXPECT_THAT(refused(good, 99), HasSubstr("chunk size 100 over the cap of 99"));

  std::string end(kChunkStreamFrameHeaderBytes, '\0');
  EncodeEndFrameHeader(1, end.data());
  bad = end;
  bad[12] = 1;  // a size on an end frame
  EXPECT_THAT(refused(bad), HasSubstr("end frame with size 1"));
  bad = end;
  bad[20] = 1;  // a hash on an end frame
  EXPECT_THAT(refused(bad), HasSubstr("hash set"));

  std::string error = EncodeErrorFrame(absl::NotFoundError("x")).substr(0, 48);
  bad = error;
  bad[8] = 0;  // code OK
  EXPECT_THAT(refused(bad), HasSubstr("error code 0"));
  bad = error;
  bad[8] = 17;
  EXPECT_THAT(refused(bad), HasSubstr("error code 17"));
  bad = error;
  bad[13] = 0x20;  // 8 KiB message
  EXPECT_THAT(refused(bad), HasSubstr("error message of 8193 bytes"));
}

}  // namespace
}  // namespace ts::sidecar
