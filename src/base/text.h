// Text from outside the program (file contents, names in a header, user
// strings) made safe to print: a terminal must never receive raw control
// characters or bytes that are not UTF-8 from a file or an option.
#pragma once

#include <string>
#include <string_view>

namespace perftrain::base {

// s with every byte that is not part of printable UTF-8 written as \xNN:
// ASCII controls (00-1f, 7f), the C1 controls (U+0080-U+009F, which some
// terminals obey too) and bytes of invalid or overlong UTF-8 sequences.
// Printable ASCII and valid UTF-8 pass unchanged. printable("a\x1b[2Jb") is
// "a\x1b[2Jb" with the escape byte spelled out as four characters.
std::string printable(std::string_view s);

// Whether printable(s) == s: no control characters, valid UTF-8.
bool is_printable(std::string_view s);

}  // namespace perftrain::base
