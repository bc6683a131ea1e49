// The PERFTRAIN_* switches that refuse a value they do not know (a
// misspelling would otherwise run the default unnoticed). Each is read once,
// at first use, which is inside the first step; the commands call
// check_switches() first, so that a bad value stops them before they write
// anything.
#pragma once

namespace perftrain::ops {

// Reads PERFTRAIN_ATTN_BWD, PERFTRAIN_ATTN_FWD and PERFTRAIN_FC1_SCHEDULE; a value either
// refuses becomes a UsageError (a one-line message, exit code 2).
void check_switches();

}  // namespace perftrain::ops
