// vmm/guest_image.h: finding and loading the flat guest images built from guests/.
//
// Images are looked up by name ("blk") in, in order: $EXITSCOPE_GUEST_DIR, <dir of the
// running binary>/guests, <dir of the running binary>/../guests, and the build tree's guest
// folder compiled in. A value containing '/' or ending in ".bin" is taken as a path.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "exitscope/status.h"
#include "vmm/guest_memory.h"

namespace exitscope::vmm {

struct GuestInfo {
  const char* name;
  const char* summary;
};
// The guests shipped with exitscope.
const std::vector<GuestInfo>& ShippedGuests();

// Folders searched for images, in order (existing or not).
std::vector<std::string> GuestSearchDirs();

// Resolves a --guest value to an image path. kNotFound lists the folders searched.
Result<std::string> FindGuestImage(const std::string& name_or_path);

// Reads an image; kInvalidArgument when empty or larger than ES_GUEST_MAX_SIZE.
Result<std::vector<uint8_t>> ReadGuestImage(const std::string& path);

// Copies `image` to ES_GUEST_LOAD_ADDR.
Status LoadGuestImage(GuestMemory& mem, const std::vector<uint8_t>& image);

}  // namespace exitscope::vmm
