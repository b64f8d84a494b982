// The guest images built from guests/: entry symbol, size, sections, and how the VMM finds
// and loads them.
#include "vmm/guest_image.h"

#include <elf.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "guests/abi.h"

namespace exitscope::vmm {
namespace {

std::vector<uint8_t> Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct Elf {
  Elf64_Ehdr eh{};
  std::vector<Elf64_Phdr> phdrs;
  std::map<std::string, Elf64_Shdr> sections;
  std::map<std::string, uint64_t> symbols;
  std::vector<uint8_t> bytes;
};

Elf ParseElf(const std::string& path) {
  Elf e;
  e.bytes = Slurp(path);
  EXPECT_GE(e.bytes.size(), sizeof(Elf64_Ehdr)) << path;
  if (e.bytes.size() < sizeof(Elf64_Ehdr)) return e;
  std::memcpy(&e.eh, e.bytes.data(), sizeof(e.eh));
  for (int i = 0; i < e.eh.e_phnum; ++i) {
    Elf64_Phdr p;
    std::memcpy(&p, e.bytes.data() + e.eh.e_phoff + i * e.eh.e_phentsize, sizeof(p));
    e.phdrs.push_back(p);
  }
  std::vector<Elf64_Shdr> sh(e.eh.e_shnum);
  for (int i = 0; i < e.eh.e_shnum; ++i)
    std::memcpy(&sh[i], e.bytes.data() + e.eh.e_shoff + i * e.eh.e_shentsize, sizeof(Elf64_Shdr));
  const char* shstr = reinterpret_cast<const char*>(e.bytes.data() + sh[e.eh.e_shstrndx].sh_offset);
  for (const auto& s : sh) {
    e.sections[shstr + s.sh_name] = s;
    if (s.sh_type == SHT_SYMTAB) {
      const char* str = reinterpret_cast<const char*>(e.bytes.data() + sh[s.sh_link].sh_offset);
      for (uint64_t off = 0; off + sizeof(Elf64_Sym) <= s.sh_size; off += sizeof(Elf64_Sym)) {
        Elf64_Sym sym;
        std::memcpy(&sym, e.bytes.data() + s.sh_offset + off, sizeof(sym));
        e.symbols[str + sym.st_name] = sym.st_value;
      }
    }
  }
  return e;
}

class ShippedGuest : public ::testing::TestWithParam<std::string> {};

TEST_P(ShippedGuest, ImageIsFlatAtTheLoadAddressWithEntryFirst) {
  const std::string dir = EXITSCOPE_GUEST_DIR_FOR_TESTS;
  const std::string name = GetParam();
  const Elf elf = ParseElf(dir + "/" + name + ".elf");
  const std::vector<uint8_t> bin = Slurp(dir + "/" + name + ".bin");
  ASSERT_FALSE(bin.empty());
  EXPECT_EQ(elf.eh.e_machine, EM_X86_64);
  EXPECT_EQ(elf.eh.e_type, ET_EXEC);
  EXPECT_EQ(elf.eh.e_entry, ES_GUEST_LOAD_ADDR);
  ASSERT_TRUE(elf.symbols.count("_start"));
  ASSERT_TRUE(elf.symbols.count("guest_main"));
  ASSERT_TRUE(elf.symbols.count("_end"));
  ASSERT_TRUE(elf.symbols.count("_image_end"));
  EXPECT_EQ(elf.symbols.at("_start"), ES_GUEST_LOAD_ADDR);
  EXPECT_LE(elf.symbols.at("_end"), ES_GUEST_LOAD_ADDR + ES_GUEST_MAX_SIZE);
  // Loadable sections live inside the image window; bss is not in the flat file.
  for (const auto& p : elf.phdrs) {
    if (p.p_type != PT_LOAD) continue;
    EXPECT_GE(p.p_vaddr, ES_GUEST_LOAD_ADDR);
    EXPECT_LE(p.p_vaddr + p.p_memsz, ES_GUEST_LOAD_ADDR + ES_GUEST_MAX_SIZE);
  }
  ASSERT_TRUE(elf.sections.count(".text"));
  const Elf64_Shdr& text = elf.sections.at(".text");
  EXPECT_EQ(text.sh_addr, ES_GUEST_LOAD_ADDR);
  EXPECT_LE(bin.size(), elf.symbols.at("_image_end") - ES_GUEST_LOAD_ADDR);
  ASSERT_GE(bin.size(), text.sh_size);
  EXPECT_EQ(0, std::memcmp(bin.data(), elf.bytes.data() + text.sh_offset, text.sh_size));
  // No writable data sections that objcopy would have had to place past bss.
  EXPECT_FALSE(elf.sections.count(".got"));
  // crt0: andq $-16,%rsp first.
  EXPECT_EQ(bin[0], 0x48);
  EXPECT_EQ(bin[1], 0x83);
  EXPECT_EQ(bin[2], 0xe4);
}

TEST_P(ShippedGuest, VmmFindsAndLoadsIt) {
  auto path = FindGuestImage(GetParam());
  ASSERT_TRUE(path) << path.error().message;
  auto image = ReadGuestImage(*path);
  ASSERT_TRUE(image) << image.error().message;
  auto mem = GuestMemory::Create(ES_DEFAULT_MEM_SIZE);
  ASSERT_TRUE(mem);
  ASSERT_TRUE(LoadGuestImage(*mem, *image));
  EXPECT_EQ(0, std::memcmp(mem->host() + ES_GUEST_LOAD_ADDR, image->data(), image->size()));
}

INSTANTIATE_TEST_SUITE_P(All, ShippedGuest, ::testing::Values("hello", "blk", "mmio-storm", "idle"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

TEST(GuestImage, ListsTheShippedGuests) {
  std::vector<std::string> names;
  for (const auto& g : ShippedGuests()) names.push_back(g.name);
  EXPECT_EQ(names, (std::vector<std::string>{"hello", "blk", "mmio-storm", "idle"}));
}

TEST(GuestImage, UnknownNameIsNotFoundAndNamesTheFoldersSearched) {
  auto r = FindGuestImage("no-such-guest");
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, ErrorCode::kNotFound);
  EXPECT_NE(r.error().message.find("no-such-guest.bin"), std::string::npos);
  EXPECT_NE(r.error().message.find("--list-guests"), std::string::npos);
  EXPECT_FALSE(FindGuestImage(""));
  EXPECT_FALSE(FindGuestImage("/nonexistent/x.bin"));
}

TEST(GuestImage, EmptyAndOversizedImagesAreRefused) {
  char tmpl[] = "/tmp/exitscope-guest-XXXXXX";
  const int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  auto empty = ReadGuestImage(tmpl);
  ASSERT_FALSE(empty);
  EXPECT_EQ(empty.error().code, ErrorCode::kInvalidArgument);
  ASSERT_EQ(0, ftruncate(fd, ES_GUEST_MAX_SIZE + 1));
  auto big = ReadGuestImage(tmpl);
  ASSERT_FALSE(big);
  EXPECT_NE(big.error().message.find("limit"), std::string::npos);
  close(fd);
  unlink(tmpl);
}

// Issue 28 item 7: a 2 GiB image was read whole (2.1 GB RSS, 12 s) before its size was
// checked. Now stat decides first: FindGuestImage (what `run` calls before anything else)
// and ReadGuestImage refuse it without reading, so the peak RSS does not grow by the file.
TEST(GuestImage, SizeAndTypeAreCheckedBeforeAnyRead) {
  char tmpl[] = "/tmp/exitscope-guest-XXXXXX.bin";
  const int fd = mkstemps(tmpl, 4);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(0, ftruncate(fd, off_t{2} << 30));  // sparse: costs no disk
  rusage before{}, after{};
  getrusage(RUSAGE_SELF, &before);
  auto found = FindGuestImage(tmpl);
  auto read = ReadGuestImage(tmpl);
  getrusage(RUSAGE_SELF, &after);
  close(fd);
  unlink(tmpl);
  ASSERT_FALSE(found);
  EXPECT_EQ(found.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(found.error().message.find("2147483648 bytes exceeds the"), std::string::npos)
      << found.error().message;
  ASSERT_FALSE(read);
  EXPECT_EQ(read.error().code, ErrorCode::kInvalidArgument);
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 64 * 1024) << "KiB of peak RSS grown";

  // Not a regular file: named as what it is, not "no such image file".
  auto dev = FindGuestImage("/dev/zero");
  ASSERT_FALSE(dev);
  EXPECT_EQ(dev.error().code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(dev.error().message,
            "--guest /dev/zero: is a character device, not a guest image file");
  auto dir = FindGuestImage("/tmp/");
  ASSERT_FALSE(dir);
  EXPECT_NE(dir.error().message.find("is a directory"), std::string::npos) << dir.error().message;
  auto zero = ReadGuestImage("/dev/zero");
  ASSERT_FALSE(zero);
  EXPECT_NE(zero.error().message.find("a character device"), std::string::npos);
}

}  // namespace
}  // namespace exitscope::vmm
