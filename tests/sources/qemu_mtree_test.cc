// QEMU device maps: `info mtree -f` as QEMU 7.2 printed it (testdata/kvm-host/qemu-7.2-q35-*,
// README there), parsed line by line and turned into devices and registers by the rules of
// qemu_mtree.h (QEMU's region names, builtin register maps by name, RAM/ROM never a device,
// " @offset" fragments named after their region, the ECAM window per PCI function).
#include "sources/qemu_mtree.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "sources/kvm_device_map.h"

namespace exitscope::sources {
namespace {

const std::string kDir = std::string(EXITSCOPE_TESTDATA_DIR) + "/kvm-host/";
// q35 with nvme, virtio-net-pci and isa-serial, BARs programmed (testdata/kvm-host/README.md).
const std::string kQ35 = kDir + "qemu-7.2-q35-mtree-f.txt";
// q35 -nodefaults with one isa-serial, after the KVM test's guest enabled the ECAM window.
const std::string kEcam = kDir + "qemu-7.2-q35-pciexbar-mtree-f.txt";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Named {
  bool found = false;
  std::string device, reg;
};

Named Look(const KvmDeviceMap& m, SubKeyKind kind, uint64_t addr, uint32_t size,
           AccessDir dir = AccessDir::kNone) {
  std::string_view d, r;
  Named n;
  n.found = m.Resolve(kind, addr, size, dir, &d, &r);
  n.device = d;
  n.reg = r;
  return n;
}

TEST(QemuMtree, ParsesEveryLineOfTheRealFlatViews) {
  const std::string text = ReadFile(kQ35);
  ASSERT_FALSE(text.empty()) << kQ35;
  EXPECT_TRUE(LooksLikeQemuMtreeFlat(text));
  EXPECT_FALSE(LooksLikeQemuMtreeTree(text));
  auto views = ParseQemuMtreeFlat(text, kQ35);
  ASSERT_TRUE(views) << views.error().message;
  ASSERT_EQ(views->size(), 3u);
  EXPECT_EQ((*views)[0].address_spaces.size(), 4u);  // the bus-master views: nothing rendered
  EXPECT_EQ((*views)[0].root, "");
  EXPECT_TRUE((*views)[0].ranges.empty());
  const QemuFlatView* io = FindQemuView(*views, "I/O");
  const QemuFlatView* mem = FindQemuView(*views, "memory");
  ASSERT_NE(io, nullptr);
  ASSERT_NE(mem, nullptr);
  EXPECT_EQ(mem, FindQemuView(*views, "cpu-memory-0"));  // one view, two address spaces
  EXPECT_EQ(io->root, "io");
  // 94 lines: 3 headers, 9 AS lines, 3 roots, one "No rendered FlatView", 2 blank lines.
  EXPECT_EQ(io->ranges.size() + mem->ranges.size(), 94u - 3 - 9 - 3 - 1 - 2);
  // Each range ends before the next starts and the I/O view covers 0..0xffff without a gap.
  uint64_t next = 0;
  for (const QemuFlatRange& r : io->ranges) {
    EXPECT_EQ(r.start, next) << r.name;
    next = r.last + 1;
  }
  EXPECT_EQ(next, 0x10000u);
  const auto find = [](const QemuFlatView& v, uint64_t start) -> const QemuFlatRange& {
    for (const QemuFlatRange& r : v.ranges)
      if (r.start == start) return r;
    static const QemuFlatRange none;
    return none;
  };
  const QemuFlatRange& rtc = find(*io, 0x71);
  EXPECT_EQ(rtc.name, "rtc");
  EXPECT_EQ(rtc.region_offset, 1u);
  EXPECT_EQ(rtc.last, 0x71u);
  EXPECT_EQ(find(*io, 0x10).name, "io");
  EXPECT_EQ(find(*io, 0x10).region_offset, 0x10u);
  EXPECT_EQ(find(*io, 0xcf9).name, "lpc-reset-control");
  EXPECT_EQ(find(*io, 0xcf9).priority, 1);
  const QemuFlatRange& ram = find(*mem, 0xe0000);
  EXPECT_EQ(ram.name, "pc.ram");  // " KVM" (a memory slot) is not part of the name
  EXPECT_EQ(ram.region_offset, 0xe0000u);
  EXPECT_EQ(ram.type, "ram");
  EXPECT_TRUE(ram.is_memory());
  EXPECT_EQ(find(*mem, 0xc0000).type, "rom");
  EXPECT_EQ(find(*mem, 0xfee00000).priority, 4096);
  EXPECT_EQ(find(*mem, 0xfebf0000).name, "nvme");
  EXPECT_FALSE(find(*mem, 0xfebf0000).is_memory());
}

TEST(QemuMtree, OwnerAndDispatchVariantsParseToTheSameRanges) {
  // `info mtree -f -o` (owners after the name, before " KVM") and `-f -d` (a Dispatch
  // section per view) of the same QEMU command line: the same ranges, the same names.
  const auto ranges = [](const std::string& path) {
    auto views = ParseQemuMtreeFlat(ReadFile(path), path);
    EXPECT_TRUE(views) << path << ": " << views.error().message;
    std::set<std::tuple<std::string, uint64_t, uint64_t, std::string, uint64_t>> out;
    if (!views) return out;
    for (const auto* as : {"memory", "I/O"}) {
      const QemuFlatView* v = FindQemuView(*views, as);
      EXPECT_NE(v, nullptr) << path << " " << as;
      if (v == nullptr) continue;
      for (const QemuFlatRange& r : v->ranges)
        out.emplace(as, r.start, r.last, r.name, r.region_offset);
    }
    return out;
  };
  const auto plain = ranges(kEcam);
  ASSERT_FALSE(plain.empty());
  EXPECT_EQ(ranges(kDir + "qemu-7.2-q35-pciexbar-mtree-f-o.txt"), plain);
  EXPECT_EQ(ranges(kDir + "qemu-7.2-q35-pciexbar-mtree-f-d.txt"), plain);
}

// The ranges of every view, by address space, for comparing two parses.
std::set<std::tuple<std::string, uint64_t, uint64_t, std::string, uint64_t, std::string>> AllRanges(
    const std::vector<QemuFlatView>& views) {
  std::set<std::tuple<std::string, uint64_t, uint64_t, std::string, uint64_t, std::string>> out;
  for (const QemuFlatView& v : views) {
    for (const std::string& as : v.address_spaces) {
      for (const QemuFlatRange& r : v.ranges)
        out.emplace(as, r.start, r.last, r.name, r.region_offset, r.type);
    }
  }
  return out;
}

// Each line of `text` with its leading spaces replaced by `per_space` for each.
std::string Reindent(const std::string& text, const std::string& per_space,
                     const std::string& eol = "\n") {
  std::string out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    size_t n = 0;
    while (n < line.size() && line[n] == ' ') ++n;
    for (size_t i = 0; i < n; ++i) out += per_space;
    out += line.substr(n) + eol;
  }
  return out;
}

TEST(QemuMtree, TreesPastedFromTheMonitorOrATicketGiveTheSameMap) {
  // The real tree as the monitor's screen shows it ("(qemu) info mtree -f", the tree, the
  // next "(qemu) " prompt) and that indented by four spaces, as a ticket holds it
  // (testdata/kvm-host/README.md).
  auto plain = ParseQemuMtreeFlat(ReadFile(kQ35), kQ35);
  ASSERT_TRUE(plain) << plain.error().message;
  const auto want = AllRanges(*plain);
  ASSERT_FALSE(want.empty());
  for (const std::string name :
       {"qemu-7.2-q35-mtree-f-monitor.txt", "qemu-7.2-q35-mtree-f-ticket.txt"}) {
    const std::string text = ReadFile(kDir + name);
    ASSERT_FALSE(text.empty()) << name;
    EXPECT_TRUE(LooksLikeQemuMtreeFlat(text)) << name;
    EXPECT_FALSE(LooksLikeQemuMtreeTree(text)) << name;
    auto views = ParseQemuMtreeFlat(text, name);
    ASSERT_TRUE(views) << views.error().message;
    EXPECT_EQ(AllRanges(*views), want) << name;
    auto m = KvmDeviceMap::Load(kDir + name);  // --device-map's loader
    ASSERT_TRUE(m) << m.error().message;
    EXPECT_EQ((*m)->device_count(), (*KvmDeviceMap::Load(kQ35))->device_count());
    EXPECT_EQ(Look(**m, SubKeyKind::kPort, 0x3f8, 1, AccessDir::kWrite).reg, "THR") << name;
    EXPECT_EQ(Look(**m, SubKeyKind::kMmio, 0xfebf1008, 4, AccessDir::kWrite).reg, "SQ1TDBL");
    EXPECT_EQ(Look(**m, SubKeyKind::kPort, 0x71, 1).device, "rtc") << name;
  }
  // Any other indentation: QEMU's levels doubled, tabs for spaces, CRLF line ends, and more
  // prompts after the tree (the monitor's next commands, typed or not).
  const std::string monitor = ReadFile(kDir + "qemu-7.2-q35-mtree-f-monitor.txt");
  for (const std::string& text :
       {Reindent(monitor, "  "), Reindent(monitor, "\t"), Reindent(monitor, " ", "\r\n"),
        "  " + Reindent(ReadFile(kQ35), "   "),
        monitor + "info mtree -f -o\n(qemu)\n(qemu) quit\n"}) {
    auto views = ParseQemuMtreeFlat(text, "pasted.txt");
    ASSERT_TRUE(views) << views.error().message;
    EXPECT_EQ(AllRanges(*views), want);
    EXPECT_TRUE(KvmDeviceMap::Parse(text, "pasted.txt"));
  }
  // `info mtree` without -f, pasted with its prompt, is still told to add -f.
  const std::string tree =
      "(qemu) info mtree\n" + Reindent(ReadFile(kDir + "qemu-7.2-q35-mtree.txt"), "  ");
  EXPECT_TRUE(LooksLikeQemuMtreeTree(tree));
  auto refused = KvmDeviceMap::Parse(tree, "tree.txt");
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("without -f"), std::string::npos);
}

TEST(QemuMtree, PastedTreesThatAreMalformedSayTheyAreQemusAndWhere) {
  const auto err = [](const std::string& text) {
    auto r = KvmDeviceMap::Parse(text, "m.txt");
    return r ? std::string("ok") : r.error().message;
  };
  const auto line_of = [](const std::string& text, const std::string& needle) -> long {
    const size_t at = text.find(needle);
    return at == std::string::npos ? 0 : 1 + std::count(text.begin(), text.begin() + at, '\n');
  };
  const std::string ticket = ReadFile(kDir + "qemu-7.2-q35-mtree-f-ticket.txt");
  const std::string monitor = ReadFile(kDir + "qemu-7.2-q35-mtree-f-monitor.txt");
  // One range line damaged in the middle of the pasted tree (its comma lost in the copy).
  std::string damaged = ticket;
  const size_t at = damaged.find("(prio 0, i/o): serial");
  ASSERT_NE(at, std::string::npos);
  damaged.replace(at, 9, "(prio 0 ");
  std::string e = err(damaged);
  EXPECT_EQ(e.rfind(fmt::format("m.txt:{}: ", line_of(damaged, "(prio 0 i/o): serial")), 0), 0u)
      << e;
  EXPECT_NE(e.find("in QEMU's `info mtree -f` output"), std::string::npos) << e;
  EXPECT_NE(e.find("serial"), std::string::npos) << e;  // the line itself, quoted
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  // The top of the tree not copied: QEMU's, and the first line is where it goes wrong.
  const std::string cut = monitor.substr(monitor.find(" AS \"I/O\""));
  e = err(cut);
  EXPECT_EQ(e.rfind("m.txt:1: expected a `FlatView #N` header first in QEMU's `info mtree -f` "
                    "output: 'AS \"I/O\", root: io'",
                    0),
            0u)
      << e;
  // Only range lines (headers left out): still QEMU's, not the device-map format.
  e = err("  00000000000003f8-00000000000003ff (prio 0, i/o): serial\n");
  EXPECT_EQ(e.rfind("m.txt:1: expected a `FlatView #N` header first in QEMU's", 0), 0u) << e;
  // Another monitor command before the tree, and the output of one after it.
  e = err("(qemu) info pci\n" + monitor);
  EXPECT_EQ(e.rfind("m.txt:1: a monitor command other than `info mtree -f`", 0), 0u) << e;
  const std::string more = monitor + "info pci\n  Bus  0, device   0, function 0:\n";
  e = err(more);
  EXPECT_EQ(e.rfind(fmt::format("m.txt:{}: text after the monitor prompt of line {}, which ended "
                                "the tree in QEMU's `info mtree -f` output: 'Bus  0, device",
                                line_of(more, "  Bus"), line_of(more, "(qemu) info pci")),
                    0),
            0u)
      << e;
  // The prompt alone.
  e = err("(qemu) info mtree -f\n(qemu) \n");
  EXPECT_EQ(e, "m.txt: no `FlatView #N` in it: not QEMU's `info mtree -f` output");
  // The device-map format keeps its own message.
  EXPECT_NE(err("uart0 uart16550 pio 0x3f8\n").find("m.txt:1: expected `name kind"),
            std::string::npos);
}

TEST(QemuMtree, PortsResolveToQemuRegionNamesAndBuiltinRegisters) {
  auto m = KvmDeviceMap::Load(kQ35);  // detected by content
  ASSERT_TRUE(m) << m.error().message;
  const KvmDeviceMap& d = **m;
  const auto port = [&](uint64_t p, uint32_t size = 1, AccessDir dir = AccessDir::kNone) {
    return Look(d, SubKeyKind::kPort, p, size, dir);
  };
  EXPECT_EQ(port(0x70).device, "rtc-index");
  EXPECT_EQ(port(0x71).device, "rtc");  // "rtc @0000000000000001": the region is rtc
  EXPECT_EQ(port(0x80).device, "ioport80");
  EXPECT_EQ(port(0x60).device, "i8042-data");
  EXPECT_EQ(port(0x64).device, "i8042-cmd");
  EXPECT_EQ(port(0x510, 2).device, "fwcfg");
  EXPECT_EQ(port(0xcf8, 4).device, "pci-conf-idx");
  EXPECT_EQ(port(0xcf9).device, "lpc-reset-control");
  EXPECT_EQ(port(0xcfa).device, "pci-conf-idx");
  EXPECT_EQ(port(0xcfc, 4).device, "pci-conf-data");
  EXPECT_EQ(port(0xc000, 2).device, "virtio-pci");
  EXPECT_EQ(port(0x5658, 4).device, "vmport");
  // Ports no device claims are QEMU's "io" region itself (reads all ones, writes dropped):
  // named as QEMU's own trace names them, with no register.
  const Named unassigned = port(0x300);
  EXPECT_TRUE(unassigned.found);
  EXPECT_EQ(unassigned.device, "io");
  EXPECT_EQ(unassigned.reg, "");
  EXPECT_EQ(port(0xe9).device, "io");
  // Both 16550s are "serial" (QEMU names them alike; the port tells them apart).
  for (const uint64_t base : {0x3f8u, 0x2f8u}) {
    EXPECT_EQ(port(base, 1, AccessDir::kWrite).device, "serial");
    EXPECT_EQ(port(base, 1, AccessDir::kWrite).reg, "THR");
    EXPECT_EQ(port(base, 1, AccessDir::kRead).reg, "RBR");
    EXPECT_EQ(port(base + 5, 1, AccessDir::kRead).reg, "LSR");
    EXPECT_EQ(port(base + 3).reg, "LCR");
  }
  // Registers only where exitscope ships the device's map.
  EXPECT_EQ(port(0x71).reg, "");
  EXPECT_EQ(port(0xcfc, 4).reg, "");
}

TEST(QemuMtree, MmioResolvesToRegionsAndRegistersAndNeverToMemory) {
  auto m = KvmDeviceMap::Load(kQ35);
  ASSERT_TRUE(m) << m.error().message;
  const KvmDeviceMap& d = **m;
  const auto mmio = [&](uint64_t a, uint32_t size = 4, AccessDir dir = AccessDir::kNone) {
    return Look(d, SubKeyKind::kMmio, a, size, dir);
  };
  // nvme BAR0 (0xfebf0000): the "nvme" region inside "nvme-bar0" holds the registers and
  // doorbells; the BAR's MSI-X table and PBA are regions of their own.
  EXPECT_EQ(mmio(0xfebf1008, 4, AccessDir::kWrite).device, "nvme");
  EXPECT_EQ(mmio(0xfebf1008, 4, AccessDir::kWrite).reg, "SQ1TDBL");
  EXPECT_EQ(mmio(0xfebf1004, 4, AccessDir::kWrite).reg, "CQ0HDBL");
  EXPECT_EQ(mmio(0xfebf0014).reg, "CC");
  EXPECT_EQ(mmio(0xfebf0000, 8).reg, "CAP");
  EXPECT_EQ(mmio(0xfebf2000).device, "msix-table");
  EXPECT_EQ(mmio(0xfebf2000).reg, "");
  EXPECT_EQ(mmio(0xfebf3000).device, "msix-pba");
  EXPECT_EQ(mmio(0xfebd1000).device, "msix-table");  // virtio-net's, same QEMU name
  // virtio-net's modern BAR: the common configuration has exitscope's map.
  const Named status = mmio(0xfe000014, 1, AccessDir::kWrite);
  EXPECT_EQ(status.device, "virtio-pci-common-virtio-net");
  EXPECT_EQ(status.reg, "STATUS");
  EXPECT_EQ(mmio(0xfe000016, 2).reg, "Q_SELECT");
  EXPECT_EQ(mmio(0xfe003000, 2, AccessDir::kWrite).device, "virtio-pci-notify-virtio-net");
  EXPECT_EQ(mmio(0xfe003000, 2, AccessDir::kWrite).reg, "");
  EXPECT_EQ(mmio(0xfe001000, 1).device, "virtio-pci-isr-virtio-net");
  EXPECT_EQ(mmio(0xfec00000).device, "kvm-ioapic");
  EXPECT_EQ(mmio(0xfed00000).device, "hpet");
  EXPECT_EQ(mmio(0xfee00300).device, "kvm-apic-msi");
  // RAM and ROM are never devices: pc.ram, pc.rom, pc.bios (both copies).
  for (const uint64_t a : {0x0ull, 0x7c00ull, 0xc0000ull, 0xe8000ull, 0xf0000ull, 0x100000ull,
                           0x3ffffffull, 0xfffffff0ull}) {
    EXPECT_FALSE(mmio(a).found) << std::hex << a;
  }
  // Between regions: nothing (MMIO has no catch-all region in QEMU's flat view).
  EXPECT_FALSE(mmio(0xfebf4000).found);
  EXPECT_FALSE(mmio(0x80000000).found);
  // Ports and MMIO are separate spaces.
  EXPECT_FALSE(mmio(0x3f8, 1).found);
  EXPECT_EQ(Look(d, SubKeyKind::kPort, 0x1008, 4).device, "io");
}

TEST(QemuMtree, DevicesAreTheDistinctRegionNames) {
  auto m = KvmDeviceMap::Load(kQ35);
  ASSERT_TRUE(m) << m.error().message;
  auto views = ParseQemuMtreeFlat(ReadFile(kQ35), kQ35);
  ASSERT_TRUE(views);
  std::set<std::string> names;
  for (const auto* as : {"memory", "I/O"})
    for (const QemuFlatRange& r : FindQemuView(*views, as)->ranges)
      if (!r.is_memory()) names.insert(r.name);
  EXPECT_EQ((*m)->device_count(), names.size());
  EXPECT_EQ(names.count("pc.ram"), 0u);
}

TEST(QemuMtree, EcamResolvesPerPciFunctionToConfigRegisters) {
  auto m = KvmDeviceMap::Load(kEcam);
  ASSERT_TRUE(m) << m.error().message;
  const auto ecam = [&](uint64_t off, uint32_t size) {
    return Look(**m, SubKeyKind::kMmio, 0xb0000000 + off, size, AccessDir::kRead);
  };
  EXPECT_EQ(ecam(0, 2).device, "pcie-mmcfg-mmio");
  EXPECT_EQ(ecam(0, 2).reg, "00:00.0.VENDOR_ID");
  EXPECT_EQ(ecam((4 << 15) | 0x10, 4).reg, "00:04.0.BAR0");
  EXPECT_EQ(ecam((31 << 15) | (2 << 12) | 0x24, 4).reg, "00:1f.2.BAR5");
  EXPECT_EQ(ecam((1 << 20) | 0x3c, 1).reg, "01:00.0.INTERRUPT_LINE");
  EXPECT_EQ(ecam(0x100, 4).reg, "00:00.0");  // past the type-0 header: the function only
  EXPECT_EQ(ecam(0x0fffffff, 1).reg, "ff:1f.7");
  EXPECT_FALSE(Look(**m, SubKeyKind::kMmio, 0xc0000000, 4).found);
}

TEST(QemuMtree, FragmentsCountRegisterOffsetsFromTheRegionStart) {
  // Constructed (no real QEMU output has a fragment of a mapped region): a 16550 whose first
  // four ports a higher-priority region covers, leaving "serial @0000000000000004".
  constexpr std::string_view kText =
      "FlatView #0\n"
      " AS \"I/O\", root: io\n"
      " Root memory region: io\n"
      "  00000000000003f8-00000000000003fb (prio 1, i/o): cover\n"
      "  00000000000003fc-00000000000003ff (prio 0, i/o): serial @0000000000000004\n";
  auto m = KvmDeviceMap::Parse(kText, "fragment.txt");
  ASSERT_TRUE(m) << m.error().message;
  EXPECT_EQ(Look(**m, SubKeyKind::kPort, 0x3fd, 1, AccessDir::kRead).reg, "LSR");
  EXPECT_EQ(Look(**m, SubKeyKind::kPort, 0x3fc, 1).reg, "MCR");
  EXPECT_EQ(Look(**m, SubKeyKind::kPort, 0x3f8, 1).device, "cover");
}

TEST(QemuMtree, RegisterMapsAreChosenByQemuRegionName) {
  EXPECT_EQ(QemuRegisterMapFor("serial", 8), "uart16550");
  EXPECT_EQ(QemuRegisterMapFor("serial", 32), "");  // MMIO 16550 with regshift 2
  EXPECT_EQ(QemuRegisterMapFor("nvme", 0x2000), "nvme");
  EXPECT_EQ(QemuRegisterMapFor("nvme-bar0", 0x4000), "");  // the container, never a range
  EXPECT_EQ(QemuRegisterMapFor("virtio-pci-common-virtio-blk", 0x1000), "virtio-pci-common");
  EXPECT_EQ(QemuRegisterMapFor("virtio-pci-notify-virtio-net", 0x1000), "");
  EXPECT_EQ(QemuRegisterMapFor("virtio-mmio", 0x200), "virtio-mmio");
  EXPECT_EQ(QemuRegisterMapFor("pcie-mmcfg-mmio", 0x10000000), "pci-config");
  EXPECT_EQ(QemuRegisterMapFor("pci-conf-data", 4), "");
}

TEST(QemuMtree, BadInputIsOneLineNamingFileAndLine) {
  // `info mtree` without -f: refused with what to give instead.
  auto tree = KvmDeviceMap::Load(kDir + "qemu-7.2-q35-mtree.txt");
  ASSERT_FALSE(tree);
  EXPECT_NE(tree.error().message.find("without -f"), std::string::npos) << tree.error().message;
  EXPECT_EQ(tree.error().message.find('\n'), std::string::npos);
  const auto err = [](std::string_view text) {
    auto r = KvmDeviceMap::Parse(text, "m.txt");
    return r ? std::string("ok") : r.error().message;
  };
  // The real file cut mid-line.
  std::string cut = ReadFile(kQ35);
  cut.resize(cut.find("(prio 0, i/o): serial") + 8);
  EXPECT_EQ(err(cut).rfind("m.txt:", 0), 0u) << err(cut);
  EXPECT_NE(err(cut).find("expected `(prio N, type): name`"), std::string::npos) << err(cut);
  EXPECT_NE(err("FlatView #0\n  0000000000000010-000000000000000f (prio 0, i/o): x\n")
                .find("m.txt:2: range ends before it starts"),
            std::string::npos);
  EXPECT_NE(err("FlatView #0\n  00000000000000zz-000000000000000f (prio 0, i/o): x\n")
                .find("m.txt:2: bad address range"),
            std::string::npos);
  EXPECT_NE(err("FlatView #0\n  0000000000000010-0000000000000010 (prio 0, i/o): x\n"
                "  0000000000000010-0000000000000011 (prio 0, i/o): y\n")
                .find("m.txt:3: range starts at 0x10, inside the previous one"),
            std::string::npos);
  EXPECT_NE(err("FlatView #0\n AS \"vfio\", root: x\n  0-1 (prio 0, i/o): x\n")
                .find("m.txt: no FlatView of address space \"memory\" or \"I/O\""),
            std::string::npos);
  // Region names that are no AddressSpace name still resolve under QEMU's name.
  auto odd = KvmDeviceMap::Parse(
      "FlatView #0\n AS \"memory\", root: system\n"
      "  00000000fe000000-00000000fe000fff (prio 0, i/o): 0000:01:00.0 BAR 0 mmaps[0]\n"
      "  00000000fe001000-00000000fe001fff (prio 0, i/o): 0000:01:00.0 BAR 0 mmaps[1]\n",
      "vfio.txt");
  ASSERT_TRUE(odd) << odd.error().message;
  EXPECT_EQ(Look(**odd, SubKeyKind::kMmio, 0xfe000000, 4).device, "0000:01:00.0 BAR 0 mmaps[0]");
  EXPECT_EQ(Look(**odd, SubKeyKind::kMmio, 0xfe001000, 4).device, "0000:01:00.0 BAR 0 mmaps[1]");
}

}  // namespace
}  // namespace exitscope::sources
