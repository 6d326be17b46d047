#include "gemm_sm90.cuh"
#include "coda_programs.cuh"
using namespace codagpt::coda;
using namespace codagpt::coda::sm90;
#define INST(CFG, BN_MAJ, P) template __global__ void codagpt::coda::sm90::gemm_kernel<CFG, false, BN_MAJ, P>(const __grid_constant__ Params, const __grid_constant__ P);
INST(CfgPingPong128x128, false, LnBackwardX<>)
INST(CfgPingPong128x160, false, LnBackwardX<>)
