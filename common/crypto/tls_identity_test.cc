#include "common/crypto/tls_identity.h"

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "tests/util/temp_dir.h"

namespace ts::common {
namespace {

std::string Read(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

TEST(TlsIdentityTest, MadeOnceThenLoadedWithTheSameFingerprint) {
  test_util::TempDir dir("tls");
  auto made = LoadOrCreateTlsIdentity(dir.path().string(), "gonka1host");
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(made->cert_sha256.size(), 32u);
  EXPECT_NE(made->cert_pem.find("BEGIN CERTIFICATE"), std::string::npos);
  EXPECT_NE(made->key_pem.find("PRIVATE KEY"), std::string::npos);
  struct stat st;
  ASSERT_EQ(::stat((dir.path() / kTlsKeyFile).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(Read(dir.path() / kTlsCertFile), made->cert_pem);

  auto loaded = LoadOrCreateTlsIdentity(dir.path().string(), "gonka1host");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->cert_sha256, made->cert_sha256);
  EXPECT_EQ(loaded->key_pem, made->key_pem);
  auto fingerprint = CertificateSha256(loaded->cert_pem);
  ASSERT_TRUE(fingerprint.ok());
  EXPECT_EQ(*fingerprint, made->cert_sha256);

  // Another identity has another fingerprint.
  auto other = NewTlsIdentity("gonka1host");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->cert_sha256, made->cert_sha256);
}

TEST(TlsIdentityTest, ADamagedIdentityIsRefusedNeverReplaced) {
  test_util::TempDir dir("tls");
  auto made = LoadOrCreateTlsIdentity(dir.path().string(), "gonka1host");
  ASSERT_TRUE(made.ok());
  const auto key = dir.path() / kTlsKeyFile;
  const auto cert = dir.path() / kTlsCertFile;

  // The key of another identity beside this certificate.
  auto other = NewTlsIdentity("gonka1host");
  ASSERT_TRUE(other.ok());
  std::ofstream(key, std::ios::trunc) << other->key_pem;
  auto mismatch = LoadOrCreateTlsIdentity(dir.path().string(), "gonka1host");
  ASSERT_FALSE(mismatch.ok());
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(mismatch.status().message().find("is not the key of"), std::string::npos);

  // Not PEM at all.
  std::ofstream(cert, std::ios::trunc) << "garbage";
  auto garbage = LoadOrCreateTlsIdentity(dir.path().string(), "gonka1host");
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.status().message().find("not a PEM certificate"), std::string::npos);

  // One file without the other: refused, naming the missing one, and nothing written.
  std::filesystem::remove(cert);
  auto half = LoadOrCreateTlsIdentity(dir.path().string(), "gonka1host");
  ASSERT_FALSE(half.ok());
  EXPECT_EQ(half.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(half.status().message().find(cert.string() + " is missing"), std::string::npos)
      << half.status();
  EXPECT_FALSE(std::filesystem::exists(cert));
  EXPECT_EQ(Read(key), other->key_pem);

  EXPECT_FALSE(CertificateSha256("no certificate here").ok());
}

}  // namespace
}  // namespace ts::common
