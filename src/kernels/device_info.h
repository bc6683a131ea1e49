// Device properties the kernels size their grids by (cached by the caller).
#pragma once

namespace perftrain::kernels {

int multiprocessor_count();  // of the current device

}  // namespace perftrain::kernels
