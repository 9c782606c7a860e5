// The register-blocked micro-kernels of the tile products (tile_gemm.cpp, tile_dot_bf16.cpp)
// come as a template block<MR, NV>: MR rows of C (1..6) by NV vectors of 16 lanes (1..4).
// pick_block turns the run-time sizes into the instance, through `pick`, a lambda templated
// on <int MR, int NV> that returns the instance's address.
#pragma once

namespace memfit {

template <int MR, class Pick>
auto pick_lanes(int nv, Pick pick) {
  switch (nv) {
    case 1: return pick.template operator()<MR, 1>();
    case 2: return pick.template operator()<MR, 2>();
    case 3: return pick.template operator()<MR, 3>();
    default: return pick.template operator()<MR, 4>();
  }
}

template <class Pick>
auto pick_block(int rows, int nv, Pick pick) {
  switch (rows) {
    case 1: return pick_lanes<1>(nv, pick);
    case 2: return pick_lanes<2>(nv, pick);
    case 3: return pick_lanes<3>(nv, pick);
    case 4: return pick_lanes<4>(nv, pick);
    case 5: return pick_lanes<5>(nv, pick);
    default: return pick_lanes<6>(nv, pick);
  }
}

}  // namespace memfit
