// For the harnesses of HDF5 readers (fuzz_token_file, fuzz_checkpoint); fuzz_common.hpp stays free of
// HDF5 so the other harnesses need not link it.
#pragma once

#include <hdf5.h>

#include "tests/fuzz/fuzz_common.hpp"

namespace gpt2::fuzz {

// Every HDF5 identifier our readers opened is closed again, also when they reject the file (RAII
// on the unwinding path). A leaked file id would keep the file open across the job's lifetime.
inline void check_no_open_hdf5_ids() {
  if (H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL) != 0) property_failed("HDF5 identifiers left open");
}

}  // namespace gpt2::fuzz
