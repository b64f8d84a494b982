#include "base/clock_name.h"

namespace exitscope::base {

std::string SelectedClock(std::string_view listing) {
  const size_t open = listing.find('[');
  if (open != std::string_view::npos) {
    const size_t close = listing.find(']', open);
    if (close == std::string_view::npos) return {};
    return std::string(listing.substr(open + 1, close - open - 1));
  }
  constexpr std::string_view kSpace = " \t\r\n";
  const size_t first = listing.find_first_not_of(kSpace);
  if (first == std::string_view::npos) return {};
  const size_t last = listing.find_last_not_of(kSpace);
  const std::string_view word = listing.substr(first, last - first + 1);
  if (word.find_first_of(kSpace) != std::string_view::npos) return {};
  return std::string(word);
}

}  // namespace exitscope::base
