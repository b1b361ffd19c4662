// Key files: keygen's files round-trip, CZMQ's format is read, and every unusable file is
// refused naming the file (and line) and what is wrong.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "security/curve_keys.h"

namespace dsactor::security {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class KeyFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dsactor-keys-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path write(const std::string& name, const std::string& text, fs::perms perms) {
    fs::create_directories(dir_);
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    fs::permissions(p, perms);
    return p;
  }
  template <class F>
  std::string error_of(F f) {
    try {
      f();
    } catch (const KeyFileError& e) {
      return e.what();
    }
    ADD_FAILURE() << "no KeyFileError";
    return {};
  }
  fs::path dir_;
};

mode_t mode_of(const fs::path& p) {
  struct stat st {};
  EXPECT_EQ(::stat(p.c_str(), &st), 0);
  return st.st_mode & 07777;
}

TEST_F(KeyFiles, KeygenPairRoundTripsWithPrivatePermissions) {
  const CurveKeypair keys = generate_keypair();
  EXPECT_TRUE(is_z85_key(keys.public_key));
  EXPECT_TRUE(is_z85_key(keys.secret_key));
  EXPECT_NE(keys.public_key, generate_keypair().public_key);
  const fs::path secret = write_keypair(dir_ / "keys", "trainer", keys);
  EXPECT_EQ(secret, dir_ / "keys" / "trainer.key_secret");
  EXPECT_EQ(mode_of(secret), 0600u);
  EXPECT_EQ(mode_of(dir_ / "keys"), 0700u);
  EXPECT_EQ(mode_of(dir_ / "keys" / "trainer.key"), 0644u);
  const CurveKeypair back = read_secret_key_file(secret);
  EXPECT_EQ(back.public_key, keys.public_key);
  EXPECT_EQ(back.secret_key, keys.secret_key);
  EXPECT_EQ(read_public_key_file(dir_ / "keys" / "trainer.key"), keys.public_key);
  EXPECT_EQ(read_public_key_file(secret), keys.public_key);  // its public half
  // Nothing secret in the public certificate.
  std::ifstream in(dir_ / "keys" / "trainer.key");
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  EXPECT_THAT(text, ::testing::Not(HasSubstr(keys.secret_key)));
  EXPECT_THAT(error_of([&] { write_keypair(dir_ / "keys", "trainer", generate_keypair()); }),
              HasSubstr("refusing to replace a secret key"));
  EXPECT_EQ(read_secret_key_file(secret).secret_key, keys.secret_key);  // untouched
  write_keypair(dir_ / "keys", "trainer", generate_keypair(), /*overwrite=*/true);
  EXPECT_NE(read_secret_key_file(secret).secret_key, keys.secret_key);
}

TEST_F(KeyFiles, ReadsCzmqCertificatesWithMetadataAndComments) {
  const CurveKeypair k = generate_keypair();
  const auto p = write("czmq.key_secret",
                       "#   ZeroMQ CURVE **Secret** Certificate\n\nmetadata\n    name = \"x\"\n"
                       "    email = \"a@b\"\ncurve\n    public-key = \"" +
                           k.public_key + "\"\n    secret-key = \"" + k.secret_key + "\"\n",
                       fs::perms::owner_read | fs::perms::owner_write);
  const CurveKeypair back = read_secret_key_file(p);
  EXPECT_EQ(back.public_key, k.public_key);
  EXPECT_EQ(back.secret_key, k.secret_key);
  // A file holding just one Z85 key is a public key.
  const auto bare = write("bare.key", k.public_key + "\n", fs::perms::owner_read);
  EXPECT_EQ(read_public_key_file(bare), k.public_key);
}

TEST_F(KeyFiles, RefusesUnusableFilesNamingWhy) {
  const auto owner = fs::perms::owner_read | fs::perms::owner_write;
  const CurveKeypair k = generate_keypair();
  const std::string cert = "curve\n    public-key = \"" + k.public_key + "\"\n    secret-key = \"" +
                           k.secret_key + "\"\n";
  auto readable = write("open.key_secret", cert, owner | fs::perms::group_read);
  EXPECT_THAT(error_of([&] { read_secret_key_file(readable); }),
              HasSubstr("mode 0640 lets others read the secret key"));
  auto bad_key = write("bad.key_secret", "curve\n    secret-key = \"tooshort\"\n", owner);
  EXPECT_THAT(error_of([&] { read_secret_key_file(bad_key); }),
              HasSubstr("bad.key_secret:2: secret-key is not a CurveZMQ key"));
  auto unquoted = write("unq.key_secret", "curve\n    secret-key = " + k.secret_key + "\n", owner);
  EXPECT_THAT(error_of([&] { read_secret_key_file(unquoted); }),
              HasSubstr("unq.key_secret:2: secret-key: the value must be in double quotes"));
  auto typo = write("typo.key_secret", "curve\n    secret_key = \"" + k.secret_key + "\"\n", owner);
  EXPECT_THAT(error_of([&] { read_secret_key_file(typo); }),
              HasSubstr("unknown key `secret_key` in section curve"));
  auto pub_only = write("pub.key", "curve\n    public-key = \"" + k.public_key + "\"\n", owner);
  EXPECT_THAT(error_of([&] { read_secret_key_file(pub_only); }), HasSubstr("no secret-key"));
  const CurveKeypair other = generate_keypair();
  auto mismatched = write("mix.key_secret",
                          "curve\n    public-key = \"" + other.public_key +
                              "\"\n    secret-key = \"" + k.secret_key + "\"\n",
                          owner);
  EXPECT_THAT(error_of([&] { read_secret_key_file(mismatched); }),
              HasSubstr("public-key does not belong to secret-key"));
  EXPECT_THAT(error_of([&] { read_secret_key_file(dir_ / "missing.key_secret"); }),
              HasSubstr("missing.key_secret: cannot read"));
}

TEST_F(KeyFiles, KeysHoldingZ85DigitsHashAndEqualsAreKeys) {
  // '#' is a Z85 digit (never a key's first, see is_comment).
  CurveKeypair k = generate_keypair();
  while (k.public_key.find('#') == std::string::npos) k = generate_keypair();
  const auto bare = write("hash.key", k.public_key + "\n", fs::perms::owner_read);
  EXPECT_EQ(read_public_key_file(bare), k.public_key);
  // '=' is one too, which a bare key file must not read as a 'name = value' line.
  CurveKeypair e = generate_keypair();
  while (e.public_key.find('=') == std::string::npos) e = generate_keypair();
  const auto eq = write("eq.key", e.public_key + "\n", fs::perms::owner_read);
  EXPECT_EQ(read_public_key_file(eq), e.public_key);
  const auto list = write("hash_list", "# comment\n" + k.public_key + " name\n",
                          fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(read_authorized_keys(list), std::vector<std::string>{k.public_key});
}

TEST_F(KeyFiles, AuthorizedKeysFromAListOrADirectory) {
  const CurveKeypair a = generate_keypair(), b = generate_keypair();
  auto list =
      write("authorized", "# trainers\n" + a.public_key + " rank0\n\n" + b.public_key + "\n",
            fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(read_authorized_keys(list), (std::vector<std::string>{a.public_key, b.public_key}));
  write_keypair(dir_ / "certs", "b", b);
  write_keypair(dir_ / "certs", "a", a);
  EXPECT_EQ(read_authorized_keys(dir_ / "certs"),
            (std::vector<std::string>{a.public_key, b.public_key}));
  auto bad = write("bad_list", a.public_key + "\nnot-a-key\n",
                   fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_THAT(error_of([&] { read_authorized_keys(bad); }),
              HasSubstr("bad_list:2: `not-a-key` is not a CurveZMQ public key"));
  auto empty = write("empty", "# nobody\n", fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_THAT(error_of([&] { read_authorized_keys(empty); }), HasSubstr("lists no public key"));
}

}  // namespace
}  // namespace dsactor::security
