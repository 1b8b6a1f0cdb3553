// The AMX tile configuration every fd tile kernel runs under: palette 1, tiles 0-7 of 16 rows x 64 bytes.
// Include at file scope (outside any ISA namespace): the function carries its own target attribute.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace fdk {

// Loads the configuration on the calling thread (each thread that issues tile instructions needs it).
__attribute__((target("amx-tile"))) inline void load_amx_tile_config() {
  struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
  } cfg{};
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  // GCC's _tile_loadconfig tells the compiler it reads 8 bytes of cfg only, so without this the other
  // stores may be dropped as dead (a #GP on ldtilecfg): the barrier makes the whole struct observable.
  asm volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

}  // namespace fdk
