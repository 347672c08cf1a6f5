#include "send/stream.h"

#include <gtest/gtest.h>

#include <cstring>

#include "format/checksum.h"
#include "format/endian.h"

namespace ubtrfs::send {
namespace UBTRFS_UNITY_ID {

std::vector<uint8_t> Build(uint32_t version, const std::function<void(StreamWriter&)>& body) {
  std::vector<uint8_t> out;
  StreamWriter w(version, [&](std::span<const uint8_t> b) {
    out.insert(out.end(), b.begin(), b.end());
    return Status::Ok();
  });
  EXPECT_TRUE(w.WriteHeader().ok());
  body(w);
  return out;
}

ReadFn FromBytes(const std::vector<uint8_t>& bytes, size_t chunk = 1 << 20) {
  auto pos = std::make_shared<size_t>(0);
  return [&bytes, pos, chunk](std::span<uint8_t> buf) -> Result<size_t> {
    size_t n = std::min({buf.size(), bytes.size() - *pos, chunk});
    if (n > 0) std::memcpy(buf.data(), bytes.data() + *pos, n);
    *pos += n;
    return n;
  };
}

// Reads every command; the first error's status, or Ok.
Status ReadAll(const std::vector<uint8_t>& bytes, std::vector<Command>* cmds = nullptr, size_t chunk = 1 << 20) {
  StreamReader r(FromBytes(bytes, chunk));
  for (;;) {
    Command c;
    auto more = r.Next(&c);
    if (!more.ok()) return more.status();
    if (!*more) return Status::Ok();
    if (cmds) cmds->push_back(c);
  }
}

void Snapshot(StreamWriter& w) {
  w.Begin(kCmdSnapshot);
  w.String(kAttrPath, "snap");
  w.PutUuid(kAttrUuid, Uuid{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16});
  w.U64(kAttrCtransid, 42);
  w.PutUuid(kAttrCloneUuid, Uuid{16, 15});
  w.U64(kAttrCloneCtransid, 41);
  ASSERT_TRUE(w.End().ok());
}

void Write(StreamWriter& w, std::string_view path, uint64_t off, std::span<const uint8_t> data) {
  w.Begin(kCmdWrite);
  w.String(kAttrPath, path);
  w.U64(kAttrFileOffset, off);
  w.Data(data);
  ASSERT_TRUE(w.End().ok());
}

void End(StreamWriter& w) {
  w.Begin(kCmdEnd);
  ASSERT_TRUE(w.End().ok());
}

TEST(SendStream, RoundTripsEveryAttributeType) {
  for (uint32_t v : {1u, 2u, 3u}) {
    std::vector<uint8_t> data(5000);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7);
    auto bytes = Build(v, [&](StreamWriter& w) {
      Snapshot(w);
      w.Begin(kCmdUtimes);
      w.String(kAttrPath, "a/b");
      w.Time(kAttrAtime, Timespec{1700000000, 5});
      w.Time(kAttrMtime, Timespec{1700000001, 999999999});
      w.Time(kAttrCtime, Timespec{3, 0});
      ASSERT_TRUE(w.End().ok());
      Write(w, "a/b", 4096, data);
      if (v >= 2) {
        w.Begin(kCmdFallocate);
        w.String(kAttrPath, "f");
        w.U32(kAttrFallocateMode, 1);
        w.U64(kAttrFileOffset, 0);
        w.U64(kAttrSize, 8192);
        ASSERT_TRUE(w.End().ok());
      }
      if (v >= 3) {
        w.Begin(kCmdEnableVerity);
        w.String(kAttrPath, "f");
        w.U8(kAttrVerityAlgorithm, 1);
        w.U32(kAttrVerityBlockSize, 4096);
        w.Bytes(kAttrVeritySaltData, data);
        w.Bytes(kAttrVeritySigData, {});
        ASSERT_TRUE(w.End().ok());
      }
      End(w);
    });
    std::vector<uint8_t> kept = bytes;  // the views below point into the reader, so re-read per check
    StreamReader r(FromBytes(kept, 777));  // short reads from the source
    Command c;
    ASSERT_TRUE(*r.Next(&c));
    EXPECT_EQ(r.version(), v);
    EXPECT_EQ(c.cmd, kCmdSnapshot);
    EXPECT_EQ(c.offset, kStreamHeaderSize);
    EXPECT_EQ(c.index, 1u);
    EXPECT_EQ(*c.String(kAttrPath), "snap");
    EXPECT_EQ((*c.GetUuid(kAttrUuid))[15], 16);
    EXPECT_EQ(*c.U64(kAttrCtransid), 42u);
    EXPECT_EQ(*c.U64(kAttrCloneCtransid), 41u);
    ASSERT_TRUE(*r.Next(&c));
    EXPECT_EQ(c.cmd, kCmdUtimes);
    EXPECT_EQ(c.Time(kAttrMtime)->sec, 1700000001u);
    EXPECT_EQ(c.Time(kAttrMtime)->nsec, 999999999u);
    ASSERT_TRUE(*r.Next(&c));
    EXPECT_EQ(c.cmd, kCmdWrite);
    EXPECT_EQ(*c.U64(kAttrFileOffset), 4096u);
    auto d = c.Bytes(kAttrData);
    ASSERT_TRUE(d.ok());
    EXPECT_TRUE(std::equal(d->begin(), d->end(), data.begin(), data.end()));
    if (v >= 2) {
      ASSERT_TRUE(*r.Next(&c));
      EXPECT_EQ(*c.U32(kAttrFallocateMode), 1u);
    }
    if (v >= 3) {
      ASSERT_TRUE(*r.Next(&c));
      EXPECT_EQ(*c.U8(kAttrVerityAlgorithm), 1);
      EXPECT_EQ(c.Bytes(kAttrVeritySaltData)->size(), data.size());
      EXPECT_TRUE(c.Has(kAttrVeritySigData));
    }
    ASSERT_TRUE(*r.Next(&c));
    EXPECT_EQ(c.cmd, kCmdEnd);
    auto more = r.Next(&c);
    ASSERT_TRUE(more.ok()) << more.status().ToString();
    EXPECT_FALSE(*more);
  }
}

TEST(SendStream, VersionTwoDataHasNoLengthAndMayPassSixtyFourKiB) {
  std::vector<uint8_t> big(200 * 1024, 0xab);
  auto bytes = Build(2, [&](StreamWriter& w) {
    Snapshot(w);
    Write(w, "f", 0, big);
    End(w);
  });
  std::vector<Command> cmds;
  ASSERT_TRUE(ReadAll(bytes, &cmds).ok());
  // v1 cannot carry it: the 16-bit length would wrap.
  std::vector<uint8_t> out;
  StreamWriter w1(1, [&](std::span<const uint8_t> b) {
    out.insert(out.end(), b.begin(), b.end());
    return Status::Ok();
  });
  w1.Begin(kCmdWrite);
  w1.Data(big);
  EXPECT_EQ(w1.End().code(), EINVAL);
}

TEST(SendStream, WrongTypeSizesAndMissingAttributesNameTheCommand) {
  auto bytes = Build(1, [&](StreamWriter& w) {
    w.Begin(kCmdTruncate);
    w.String(kAttrPath, "f");
    w.U32(kAttrSize, 5);  // a u64 attribute
    ASSERT_TRUE(w.End().ok());
    End(w);
  });
  StreamReader r(FromBytes(bytes));
  Command c;
  ASSERT_TRUE(*r.Next(&c));
  auto size = c.U64(kAttrSize);
  ASSERT_FALSE(size.ok());
  EXPECT_NE(size.status().message().find("command 1 (truncate) at byte 17"), std::string::npos)
      << size.status().message();
  EXPECT_NE(size.status().message().find("size is 4 bytes, not 8"), std::string::npos);
  auto mode = c.U64(kAttrMode);
  ASSERT_FALSE(mode.ok());
  EXPECT_NE(mode.status().message().find("no mode attribute"), std::string::npos);
}

TEST(SendStream, EveryCutIsAnErrorNamingWhere) {
  std::vector<uint8_t> data(3000, 1);
  auto bytes = Build(1, [&](StreamWriter& w) {
    Snapshot(w);
    Write(w, "f", 0, data);
    End(w);
  });
  ASSERT_TRUE(ReadAll(bytes).ok());
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    std::vector<uint8_t> part(bytes.begin(), bytes.begin() + cut);
    Status st = ReadAll(part);
    ASSERT_FALSE(st.ok()) << "cut at " << cut;
    EXPECT_NE(st.message().find("byte"), std::string::npos) << st.message();
  }
}

TEST(SendStream, EveryFlippedBitIsCaught) {
  auto bytes = Build(2, [&](StreamWriter& w) {
    Snapshot(w);
    Write(w, "f", 0, std::vector<uint8_t>(100, 3));
    End(w);
  });
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      // Version 2 read as 3 is the same stream: v3 only adds numbers.
      if (i == kMagicSize && bit == 0) continue;
      auto bad = bytes;
      bad[i] ^= static_cast<uint8_t>(1u << bit);
      EXPECT_FALSE(ReadAll(bad).ok()) << "byte " << i << " bit " << bit;
    }
  }
  // A changed body byte is a CRC error of that command.
  auto bad = bytes;
  bad[kStreamHeaderSize + kCmdHeaderSize + 3] ^= 1;
  Status st = ReadAll(bad);
  EXPECT_EQ(st.code(), EBADMSG);
  EXPECT_NE(st.message().find("command 1 (snapshot) at byte 17: CRC32C mismatch"), std::string::npos)
      << st.message();
}

// Rewrites command `n`'s CRC after a deliberate change to it.
void Reseal(std::vector<uint8_t>& bytes, size_t cmd_offset) {
  const uint32_t len = format::LoadLe<uint32_t>(bytes.data() + cmd_offset);
  std::memset(bytes.data() + cmd_offset + 6, 0, 4);
  const uint32_t crc = format::Crc32c(0, std::span(bytes.data() + cmd_offset, kCmdHeaderSize + len));
  format::StoreLe<uint32_t>(bytes.data() + cmd_offset + 6, crc);
}

TEST(SendStream, BadStructureWithAGoodCrcIsRefused) {
  auto base = Build(1, [&](StreamWriter& w) {
    Snapshot(w);
    End(w);
  });
  const size_t c0 = kStreamHeaderSize;
  {  // attribute length past the command's end
    auto b = base;
    format::StoreLe<uint16_t>(b.data() + c0 + kCmdHeaderSize + 2, 60000);
    Reseal(b, c0);
    Status st = ReadAll(b);
    EXPECT_NE(st.message().find("runs past the command's end"), std::string::npos) << st.message();
  }
  {  // unknown attribute
    auto b = base;
    format::StoreLe<uint16_t>(b.data() + c0 + kCmdHeaderSize, 99);
    Reseal(b, c0);
    EXPECT_NE(ReadAll(b).message().find("unknown attribute 99"), std::string::npos);
  }
  {  // a v2 command in a v1 stream
    auto b = base;
    format::StoreLe<uint16_t>(b.data() + c0 + 4, kCmdEncodedWrite);
    Reseal(b, c0);
    EXPECT_NE(ReadAll(b).message().find("unknown command for stream version 1"), std::string::npos);
  }
  {  // a huge length is refused before any allocation
    auto b = base;
    format::StoreLe<uint32_t>(b.data() + c0, 0xfffffff0u);
    EXPECT_NE(ReadAll(b).message().find("over the limit"), std::string::npos);
  }
  {  // duplicate attribute
    auto b = Build(1, [&](StreamWriter& w) {
      w.Begin(kCmdUnlink);
      w.String(kAttrPath, "a");
      w.String(kAttrPath, "b");
      ASSERT_TRUE(w.End().ok());
      End(w);
    });
    EXPECT_NE(ReadAll(b).message().find("path appears twice"), std::string::npos);
  }
  for (uint32_t v : {0u, 4u}) {
    auto b = base;
    format::StoreLe<uint32_t>(b.data() + kMagicSize, v);
    EXPECT_EQ(ReadAll(b).code(), EOPNOTSUPP);
  }
  {
    auto b = base;
    b[0] = 'x';
    EXPECT_NE(ReadAll(b).message().find("no btrfs-stream magic at byte 0"), std::string::npos);
  }
  EXPECT_NE(ReadAll({}).message().find("empty input"), std::string::npos);
}

TEST(SendStream, ConcatenatedStreamsAreRead) {
  auto a = Build(1, [&](StreamWriter& w) {
    Snapshot(w);
    End(w);
  });
  auto b = Build(2, [&](StreamWriter& w) {
    Snapshot(w);
    End(w);
  });
  auto both = a;
  both.insert(both.end(), b.begin(), b.end());
  std::vector<Command> cmds;
  ASSERT_TRUE(ReadAll(both, &cmds).ok());
  ASSERT_EQ(cmds.size(), 4u);
  EXPECT_EQ(cmds[2].offset, a.size() + kStreamHeaderSize);
  EXPECT_EQ(cmds[3].index, 4u);
  // A second stream cut in its header is an error.
  both.resize(a.size() + 5);
  EXPECT_NE(ReadAll(both).message().find("cut in its header"), std::string::npos);
}

TEST(SendStream, StringsWithNulAreRefused) {
  auto b = Build(1, [&](StreamWriter& w) {
    w.Begin(kCmdUnlink);
    w.String(kAttrPath, std::string_view("a\0b", 3));
    ASSERT_TRUE(w.End().ok());
    End(w);
  });
  StreamReader r(FromBytes(b));
  Command c;
  ASSERT_TRUE(*r.Next(&c));
  EXPECT_FALSE(c.String(kAttrPath).ok());
}

}  // namespace
}  // namespace ubtrfs::send
