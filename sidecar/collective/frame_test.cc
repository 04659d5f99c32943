#include "sidecar/collective/frame.h"

#include <string>

#include "gtest/gtest.h"

namespace ts::sidecar {
namespace {

constexpr uint32_t kMaxData = (4u << 20) + 4096;

std::string Header(FrameType type, uint32_t payload_size) {
  FrameHeader h;
  h.type = type;
  h.payload_size = payload_size;
  return EncodeFrameHeader(h);
}

void PutU32(std::string* s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) (*s)[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

TEST(FrameHeaderTest, LayoutIsLittleEndianAsDocumented) {
  FrameHeader h;
  h.type = FrameType::kData;
  h.op_id = 0x0102030405060708ULL;
  h.step = 0x11121314;
  h.chunk = 0x21222324;
  h.payload_size = 0x00010203;
  const std::string bytes = EncodeFrameHeader(h);
  ASSERT_EQ(bytes.size(), kFrameHeaderSize);
  EXPECT_EQ(bytes.substr(0, 4), "TSCF");
  EXPECT_EQ(bytes[4], 1);
  EXPECT_EQ(bytes[5], 4);
  EXPECT_EQ(bytes.substr(6, 2), std::string(2, '\0'));
  EXPECT_EQ(bytes.substr(8, 8), std::string("\x08\x07\x06\x05\x04\x03\x02\x01", 8));
  EXPECT_EQ(bytes.substr(16, 4), "\x14\x13\x12\x11");
  EXPECT_EQ(bytes.substr(20, 4), "\x24\x23\x22\x21");
  EXPECT_EQ(bytes.substr(24, 4), std::string("\x03\x02\x01\x00", 4));
  EXPECT_EQ(bytes.substr(28, 4), std::string(4, '\0'));

  char raw[kFrameHeaderSize];
  EncodeFrameHeader(h, raw);
  EXPECT_EQ(std::string(raw, kFrameHeaderSize), bytes);
}

TEST(FrameHeaderTest, RoundTripsEveryType) {
  for (FrameType type : {FrameType::kHello, FrameType::kHelloAck, FrameType::kHeartbeat,
                         FrameType::kData, FrameType::kAbort, FrameType::kClose}) {
    FrameHeader h;
    h.type = type;
    h.op_id = 77;
    h.step = 3;
    h.chunk = 9;
    h.payload_size = type == FrameType::kHeartbeat || type == FrameType::kClose ? 0 : 100;
    absl::StatusOr<FrameHeader> back = DecodeFrameHeader(EncodeFrameHeader(h), kMaxData);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->type, type);
    EXPECT_EQ(back->op_id, 77u);
    EXPECT_EQ(back->step, 3u);
    EXPECT_EQ(back->chunk, 9u);
    EXPECT_EQ(back->payload_size, h.payload_size);
    EXPECT_EQ(back->flags, 0);
  }
}

TEST(FrameHeaderTest, RefusesMalformedHeaders) {
  const std::string good = Header(FrameType::kData, 10);
  ASSERT_TRUE(DecodeFrameHeader(good, kMaxData).ok());

  auto expect_invalid = [](const std::string& bytes, std::string_view what) {
    absl::StatusOr<FrameHeader> h = DecodeFrameHeader(bytes, kMaxData);
    ASSERT_FALSE(h.ok()) << what;
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument) << h.status();
    EXPECT_NE(h.status().message().find(std::string(what)), absl::string_view::npos) << h.status();
  };
  expect_invalid(good.substr(0, 31), "31 bytes");
  expect_invalid(good + "x", "33 bytes");
  expect_invalid("", "0 bytes");

  std::string bad = good;
  bad[0] = 'X';
  expect_invalid(bad, "magic");
  bad = good;
  bad[4] = 2;
  expect_invalid(bad, "version 2");
  bad = good;
  bad[5] = 0;
  expect_invalid(bad, "unknown type 0");
  bad = good;
  bad[5] = 7;
  expect_invalid(bad, "unknown type 7");
  bad = good;
  bad[5] = static_cast<char>(0xff);
  expect_invalid(bad, "unknown type 255");
  bad = good;
  bad[7] = 1;
  expect_invalid(bad, "flags");
  bad = good;
  bad[31] = 1;
  expect_invalid(bad, "reserved");
  expect_invalid(Header(FrameType::kHeartbeat, 1), "heartbeat");
  expect_invalid(Header(FrameType::kClose, 5), "close");
}

TEST(FrameHeaderTest, CapsPayloadPerType) {
  struct Case {
    FrameType type;
    uint32_t cap;
  };
  for (const Case& c : {Case{FrameType::kData, kMaxData}, Case{FrameType::kHello, 4096},
                        Case{FrameType::kHelloAck, 4096}, Case{FrameType::kAbort, 1024}}) {
    EXPECT_TRUE(DecodeFrameHeader(Header(c.type, c.cap), kMaxData).ok());
    for (uint32_t over : {c.cap + 1, 0xFFFFFFF0u, 0xFFFFFFFFu}) {
      absl::StatusOr<FrameHeader> h = DecodeFrameHeader(Header(c.type, over), kMaxData);
      ASSERT_FALSE(h.ok());
      EXPECT_EQ(h.status().code(), absl::StatusCode::kResourceExhausted) << h.status();
      EXPECT_NE(h.status().message().find(std::to_string(over)), absl::string_view::npos)
          << h.status();
    }
  }
  // The data cap is the caller's.
  EXPECT_TRUE(DecodeFrameHeader(Header(FrameType::kData, 100), 100).ok());
  EXPECT_EQ(DecodeFrameHeader(Header(FrameType::kData, 101), 100).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(DecodeFrameHeader(Header(FrameType::kData, 0), 0).ok());
}

TEST(FrameHeaderTest, RefusesBadMagicEvenWithOtherwiseValidFields) {
  std::string bytes = Header(FrameType::kData, 1);
  PutU32(&bytes, 0, 0x46435355);
  EXPECT_EQ(DecodeFrameHeader(bytes, kMaxData).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(AbortPayloadTest, RoundTrips) {
  const std::string address = "gonka1qqqsyqcyq5rqwzqfpg9scrgwpugpzysn3hm2kj";
  absl::StatusOr<AbortPayload> a = DecodeAbort(EncodeAbort(address, "no heartbeat for 450 ms"));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->blamed_address, address);
  EXPECT_EQ(a->reason, "no heartbeat for 450 ms");

  a = DecodeAbort(EncodeAbort("", "op 7: wrong size — 12 bytes"));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->blamed_address, "");
  EXPECT_EQ(a->reason, "op 7: wrong size — 12 bytes");

  a = DecodeAbort(std::string(1, '\0'));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->reason, "");
}

TEST(AbortPayloadTest, EncodeAlwaysProducesADecodablePayload) {
  // Control characters and invalid UTF-8 are replaced; a bad address is left out; the whole
  // is cut to the cap at a character boundary.
  std::string reason = "line1\nline2\t\x01\x7f";
  reason += "\xc3\x28";      // invalid continuation
  reason += "\xed\xa0\x80";  // surrogate
  reason += "\xc2\x85";      // U+0085, a C1 control
  reason += std::string(2000, 'x');
  for (std::string_view address : {"gonka1abc", "Gonka1ABC", "bad address", ""}) {
    const std::string payload = EncodeAbort(address, reason);
    EXPECT_LE(payload.size(), kMaxAbortPayload);
    absl::StatusOr<AbortPayload> a = DecodeAbort(payload);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(a->blamed_address, address == "gonka1abc" ? "gonka1abc" : "");
    EXPECT_EQ(a->reason.substr(0, 13), "line1?line2??");
  }
  // A multi-byte character is never split by the cut.
  const std::string euros = EncodeAbort("", std::string(3000, 'e') + "\xe2\x82\xac");
  EXPECT_TRUE(DecodeAbort(euros).ok());
  std::string many;
  for (int i = 0; i < 600; ++i) many += "\xe2\x82\xac";
  EXPECT_TRUE(DecodeAbort(EncodeAbort("", many)).ok());
  EXPECT_LE(EncodeAbort("", many).size(), kMaxAbortPayload);
}

TEST(AbortPayloadTest, RefusesMalformedPayloads) {
  auto expect_invalid = [](const std::string& payload, std::string_view what) {
    absl::StatusOr<AbortPayload> a = DecodeAbort(payload);
    ASSERT_FALSE(a.ok()) << what;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument) << a.status();
    EXPECT_NE(a.status().message().find(std::string(what)), absl::string_view::npos) << a.status();
  };
  expect_invalid("", "empty");
  expect_invalid(std::string("\x05gonk", 5), "address length 5");
  expect_invalid(std::string(1, '\xff') + "abc", "address length 255");
  expect_invalid(std::string("\x03gOn", 4), "address byte 1");
  expect_invalid(std::string("\x02g\0", 3), "address byte 1");
  expect_invalid(std::string("\x01g", 2) + "ok\nnot", "control character");
  expect_invalid(std::string("\x00", 1) + "\x7f", "control character");
  expect_invalid(std::string("\x00", 1) + "\xc2\x9f", "control character");
  expect_invalid(std::string("\x00", 1) + "\xc0\xaf", "not valid UTF-8");          // overlong
  expect_invalid(std::string("\x00", 1) + "\xed\xa0\x80", "not valid UTF-8");      // surrogate
  expect_invalid(std::string("\x00", 1) + "\xf4\x90\x80\x80", "not valid UTF-8");  // > U+10FFFF
  expect_invalid(std::string("\x00", 1) + "ok\xe2\x82", "not valid UTF-8");        // truncated
  expect_invalid(std::string("\x00", 1) + "\x80", "not valid UTF-8");
  expect_invalid(std::string(1, '\0') + std::string(kMaxAbortPayload, 'x'), "at most 1024");
  EXPECT_TRUE(DecodeAbort(std::string(1, '\0') + std::string(kMaxAbortPayload - 1, 'x')).ok());
}

}  // namespace
}  // namespace ts::sidecar
