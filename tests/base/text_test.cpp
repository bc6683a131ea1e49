#include "base/text.h"

#include <gtest/gtest.h>

#include <string>

namespace perftrain::base {
namespace {

TEST(Printable, KeepsPrintableAsciiAndUtf8) {
  for (const std::string s : {"", "runs/DiT-S-2 (a b)", "caf\xc3\xa9", "\xe2\x82\xac 5", "\xf0\x9f\x98\x80",
                              "\xef\xbf\xbd", "\xc2\xa0"}) {
    EXPECT_EQ(printable(s), s);
    EXPECT_TRUE(is_printable(s)) << s;
  }
}

TEST(Printable, EscapesControlCharacters) {
  EXPECT_EQ(printable("a\x1b[2Jb"), "a\\x1b[2Jb");
  EXPECT_EQ(printable(std::string("x\0y", 3)), "x\\x00y");
  EXPECT_EQ(printable("line\nnext\r\t\x7f"), "line\\x0anext\\x0d\\x09\\x7f");
  EXPECT_EQ(printable("\xc2\x9b"), "\\xc2\\x9b");  // U+009B, the C1 control sequence introducer
  EXPECT_FALSE(is_printable("a\x1b"));
  EXPECT_FALSE(is_printable("tab\there"));
}

TEST(Printable, EscapesBytesThatAreNotUtf8) {
  EXPECT_EQ(printable("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(printable("\xc3"), "\\xc3");                   // cut short
  EXPECT_EQ(printable("\xc3(x"), "\\xc3(x");               // no continuation byte
  EXPECT_EQ(printable("\xc0\xaf"), "\\xc0\\xaf");          // overlong '/'
  EXPECT_EQ(printable("\xe0\x80\xaf"), "\\xe0\\x80\\xaf");  // overlong, 3 bytes
  EXPECT_EQ(printable("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a UTF-16 surrogate
  EXPECT_EQ(printable("\xf4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
  EXPECT_EQ(printable("\x80ok"), "\\x80ok");
  EXPECT_FALSE(is_printable("\xff"));
}

}  // namespace
}  // namespace perftrain::base
