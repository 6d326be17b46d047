#include "gemm_sm90.cuh"
#include "coda_programs.cuh"
using namespace codagpt::coda;
using namespace codagpt::coda::sm90;
#define INST(CFG, BN_MAJ, P) template __global__ void codagpt::coda::sm90::gemm_kernel<CFG, false, BN_MAJ, P>(const __grid_constant__ Params, const __grid_constant__ P);
#define ALL(CFG) \
  INST(CFG, false, PlainStore<>) \
  INST(CFG, false, LmHeadForward<>) \
  INST(CFG, false, GeluBackward<>) \
  INST(CFG, false, LnBackwardX<>)
ALL(CfgPingPong128x128)
ALL(CfgPingPong128x160)
