// cuDNN SDPA (flash attention) through the backend graph API (cudnn_graph.h / cudnn_backend.h only).
//
// cuDNN 9.19's CUDNN_BACKEND_OPERATION_SDPA_{FWD,BWD}_DESCRIPTOR have no causal attribute (masks come
// as a score-modifier subgraph from 9.21 on), so causal SDPA is written as the pattern graph the C++
// frontend emits and the fused flash engine recognises:
//   forward:  S = (Q K^T) * scale; S = row >= col ? S : -inf; m = max_row(S); E = exp(S - m);
//             l = sum_row(E); Stats = m + log(l); O = (E / l) V
//   backward: D = sum_row(dO * O) * 1; P = exp(mask((Q K^T) * scale - Stats)); dV = P^T dO;
//             dS = P * (dO V^T - D) * scale; dK = dS^T Q; dQ = dS K
// Stats is the natural-log log-sum-exp of the scaled scores: our lse convention as it stands.
// Intermediates are virtual fp32 (bf16 where a product reads a transposed P or dS, as the frontend
// does); D lives in our workspace. Determinism: the backward writes dQ straight from its product
// (the frontend's "deterministic" form, which selects the dP-workspace engine, no atomics into an
// fp32 dQ accumulator) and engine configs carrying CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC are skipped;
// cuDNN 9.19 has no determinism knob beyond that. If no deterministic config finalizes, reserve()
// builds the fp32-accumulator form (dQ through atomics) and says so on stderr; CudnnAttention(false)
// asks for that form from the start (bench_attention times both).
//
// Layouts (C = NH * HS): Q, K, V are views of qkv [B, T, 3, NH, HS]: dims [B, NH, T, HS], strides
// [T*3C, HS, 3C, 1] (transposed: dims [B, NH, HS, T], strides [T*3C, HS, 1, 3C]); O, dO: strides
// [T*C, HS, C, 1]; dQ, dK, dV have the qkv strides inside dqkv; Stats [B, NH, T, 1] packed.
#include "attention_cudnn.cuh"

#include <cudnn.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace codagpt {

namespace {

// cuDNN 9.19 marks the handle attributes deprecated but still reads them; the frontend sets them too.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
constexpr cudnnBackendAttributeName_t kOpGraphHandle = CUDNN_ATTR_OPERATIONGRAPH_HANDLE;
constexpr cudnnBackendAttributeName_t kPlanHandle = CUDNN_ATTR_EXECUTION_PLAN_HANDLE;
#pragma GCC diagnostic pop

std::string cudnn_message(cudnnStatus_t status, const std::string& call) {
    char detail[512] = {0};
    cudnnGetLastErrorString(detail, sizeof(detail));
    std::string msg = "cuDNN attention: " + call + " failed: " + cudnnGetErrorString(status);
    if (detail[0]) msg += std::string(" (") + detail + ")";
    return msg;
}

void cudnn_check(cudnnStatus_t status, const std::string& call) {
    if (status != CUDNN_STATUS_SUCCESS) throw Error(cudnn_message(status, call));
}
#define CUDNN_CHECK(call) cudnn_check((call), #call)

// One backend descriptor; `what` names it in error messages ("tensor Q", "matmul Q.K^T", ...).
class Desc {
public:
    Desc(cudnnBackendDescriptorType_t type, std::string what) : what_(std::move(what)) {
        cudnn_check(cudnnBackendCreateDescriptor(type, &d_), "cudnnBackendCreateDescriptor(" + what_ + ")");
    }
    ~Desc() {
        if (d_) cudnnBackendDestroyDescriptor(d_);
    }
    Desc(const Desc&) = delete;
    Desc& operator=(const Desc&) = delete;

    void set(cudnnBackendAttributeName_t attr, const char* attr_name, cudnnBackendAttributeType_t type, int64_t n,
             const void* value) {
        cudnn_check(cudnnBackendSetAttribute(d_, attr, type, n, value),
                    "cudnnBackendSetAttribute(" + what_ + ", " + attr_name + ")");
    }
    void finalize() { cudnn_check(cudnnBackendFinalize(d_), "cudnnBackendFinalize(" + what_ + ")"); }
    cudnnBackendDescriptor_t get() const { return d_; }
    const std::string& what() const { return what_; }

private:
    cudnnBackendDescriptor_t d_ = nullptr;
    std::string what_;
};
#define SET(desc, attr, type, n, value) (desc).set(attr, #attr, type, n, value)

using Dims = std::array<int64_t, 4>;

// Unique ids of the tensors the variant packs bind; virtual tensors count up from kFirstVirtual.
enum Uid : int64_t {
    kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kOne, kdO, kdQ, kdK, kdV, kRowDot, kdQAccum,
    kFirstVirtual = 100,
};

// Builds one operation graph: owns every descriptor until the plan is finalized (and after:
// the plan keeps them alive with it, see Plan).
struct GraphBuilder {
    std::vector<std::unique_ptr<Desc>> keep;
    std::vector<cudnnBackendDescriptor_t> ops;
    int64_t next_virtual = kFirstVirtual;

    Desc& make(cudnnBackendDescriptorType_t type, std::string what) {
        keep.push_back(std::make_unique<Desc>(type, std::move(what)));
        return *keep.back();
    }

    cudnnBackendDescriptor_t tensor(const std::string& name, int64_t uid, cudnnDataType_t type, Dims dims, Dims strides,
                                    bool is_virtual, bool by_value = false) {
        Desc& t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, "tensor " + name);
        const int64_t alignment = 16;
        SET(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
        SET(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
        SET(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
        SET(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
        SET(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
        SET(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
        if (by_value) SET(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
        t.finalize();
        return t.get();
    }
    cudnnBackendDescriptor_t virt(const std::string& name, cudnnDataType_t type, Dims dims, Dims strides) {
        return tensor(name, next_virtual++, type, dims, strides, true);
    }
    // A float scalar passed by value (its host address goes into the variant pack).
    cudnnBackendDescriptor_t scalar(const std::string& name, int64_t uid) {
        return tensor(name, uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
    }

    void matmul(const std::string& name, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                cudnnBackendDescriptor_t c) {
        Desc& mm = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR, "matmul descriptor " + name);
        const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
        SET(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
        mm.finalize();
        Desc& op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, "matmul " + name);
        SET(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
        SET(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
        SET(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
        cudnnBackendDescriptor_t mmd = mm.get();
        SET(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mmd);
        op.finalize();
        ops.push_back(op.get());
    }

    // y = mode(x[, b[, t]]); prec is the pointwise math precision (FLOAT but for index/compare ops).
    void pointwise(const std::string& name, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                   cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y, cudnnBackendDescriptor_t t = nullptr,
                   cudnnDataType_t prec = CUDNN_DATA_FLOAT, int64_t axis = -1) {
        Desc& pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, "pointwise descriptor " + name);
        SET(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
        SET(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
        if (axis >= 0) SET(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
        pw.finalize();
        Desc& op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, "pointwise " + name);
        cudnnBackendDescriptor_t pwd = pw.get();
        SET(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pwd);
        SET(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
        if (b) SET(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
        SET(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
        if (t) SET(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
        op.finalize();
        ops.push_back(op.get());
    }

    void reduction(const std::string& name, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                   cudnnBackendDescriptor_t y) {
        Desc& rd = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, "reduction descriptor " + name);
        const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
        SET(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
        SET(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
        rd.finalize();
        Desc& op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, "reduction " + name);
        cudnnBackendDescriptor_t rdd = rd.get();
        SET(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
        SET(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
        SET(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rdd);
        op.finalize();
        ops.push_back(op.get());
    }

    void reshape(const std::string& name, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
        Desc& op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, "reshape " + name);
        SET(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
        SET(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
        op.finalize();
        ops.push_back(op.get());
    }

    // S = row >= col ? S : -inf over the last two axes of a [B, NH, T, T] score tensor.
    cudnnBackendDescriptor_t causal_mask(cudnnBackendDescriptor_t s, cudnnBackendDescriptor_t neg_inf, Dims dims,
                                         Dims strides) {
        cudnnBackendDescriptor_t row = virt("row index", CUDNN_DATA_INT32, dims, strides);
        cudnnBackendDescriptor_t col = virt("col index", CUDNN_DATA_INT32, dims, strides);
        cudnnBackendDescriptor_t keep_mask = virt("causal mask", CUDNN_DATA_BOOLEAN, dims, strides);
        cudnnBackendDescriptor_t masked = virt("masked scores", CUDNN_DATA_FLOAT, dims, strides);
        pointwise("gen row index", CUDNN_POINTWISE_GEN_INDEX, s, nullptr, row, nullptr, CUDNN_DATA_FLOAT, 2);
        pointwise("gen col index", CUDNN_POINTWISE_GEN_INDEX, s, nullptr, col, nullptr, CUDNN_DATA_FLOAT, 3);
        pointwise("row >= col", CUDNN_POINTWISE_CMP_GE, row, col, keep_mask, nullptr, CUDNN_DATA_BOOLEAN);
        pointwise("causal select", CUDNN_POINTWISE_BINARY_SELECT, s, neg_inf, masked, keep_mask);
        return masked;
    }
};

// An execution plan with everything it was built from.
struct Plan {
    std::vector<std::unique_ptr<Desc>> keep;
    cudnnBackendDescriptor_t plan = nullptr;
    int64_t workspace = 0;
};

bool has_nondeterministic_note(cudnnBackendDescriptor_t cfg) {
    Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine of a heuristics result");
    cudnnBackendDescriptor_t e = engine.get();
    int64_t n = 0;
    cudnn_check(cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e),
                "cudnnBackendGetAttribute(engine config, CUDNN_ATTR_ENGINECFG_ENGINE)");
    cudnnBackendNumericalNote_t notes[32];
    n = 0;
    cudnn_check(cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE, 32, &n, notes),
                "cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE)");
    for (int64_t i = 0; i < n; i++)
        if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return true;
    return false;
}

// Operation graph -> heuristics (mode A, then fallback) -> first engine config whose plan finalizes.
Plan finalize_plan(GraphBuilder& g, cudnnHandle_t handle, const std::string& name, bool deterministic) {
    Desc& graph = g.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, name + " operation graph");
    SET(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, (int64_t)g.ops.size(), g.ops.data());
    graph.set(kOpGraphHandle, "CUDNN_ATTR_OPERATIONGRAPH_HANDLE", CUDNN_TYPE_HANDLE, 1, &handle);
    graph.finalize();
    cudnnBackendDescriptor_t graph_d = graph.get();

    std::string tried;
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
        const char* mode_name = mode == CUDNN_HEUR_MODE_A ? "mode A" : "fallback mode";
        Desc& heur = g.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, name + " engine heuristics (" + mode_name + ")");
        SET(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph_d);
        SET(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
        try {
            heur.finalize();
        } catch (const Error& e) {
            tried += std::string(" [") + e.what() + "]";
            continue;
        }
        int64_t count = 0;
        cudnn_check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                             &count, nullptr),
                    "cudnnBackendGetAttribute(" + heur.what() + ", CUDNN_ATTR_ENGINEHEUR_RESULTS count)");
        if (count <= 0) {
            tried += std::string(" [") + mode_name + ": no engine configs]";
            continue;
        }
        std::vector<cudnnBackendDescriptor_t> cfgs;
        for (int64_t i = 0; i < count; i++)
            cfgs.push_back(g.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, name + " engine config").get());
        int64_t got = 0;
        cudnn_check(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                             count, &got, cfgs.data()),
                    "cudnnBackendGetAttribute(" + heur.what() + ", CUDNN_ATTR_ENGINEHEUR_RESULTS)");
        for (int64_t i = 0; i < got; i++) {
            if (deterministic && has_nondeterministic_note(cfgs[i])) {
                tried += std::string(" [") + mode_name + " config " + std::to_string(i) + ": nondeterministic]";
                continue;
            }
            auto plan_desc = std::make_unique<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, name + " execution plan");
            try {
                plan_desc->set(kPlanHandle, "CUDNN_ATTR_EXECUTION_PLAN_HANDLE", CUDNN_TYPE_HANDLE, 1, &handle);
                SET(*plan_desc, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
                plan_desc->finalize();
            } catch (const Error& e) {
                tried += std::string(" [") + mode_name + " config " + std::to_string(i) + ": " + e.what() + "]";
                continue;
            }
            Plan p;
            int64_t n = 0;
            cudnn_check(cudnnBackendGetAttribute(plan_desc->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                 CUDNN_TYPE_INT64, 1, &n, &p.workspace),
                        "cudnnBackendGetAttribute(" + name + " execution plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE)");
            p.plan = plan_desc->get();
            p.keep = std::move(g.keep);
            p.keep.push_back(std::move(plan_desc));
            return p;
        }
    }
    throw Error("cuDNN attention: no engine config of the " + name + " graph finalizes:" + tried);
}

Dims qkv_strides(int64_t T, int64_t C, int64_t HS) { return {T * 3 * C, HS, 3 * C, 1}; }
Dims qkv_strides_t(int64_t T, int64_t C, int64_t HS) { return {T * 3 * C, HS, 1, 3 * C}; }

Plan build_forward(cudnnHandle_t handle, int64_t B, int64_t T, int64_t NH, int64_t HS) {
    const int64_t C = NH * HS;
    GraphBuilder g;
    const Dims bhtd = {B, NH, T, HS}, bhdt = {B, NH, HS, T}, bhtt = {B, NH, T, T}, bht1 = {B, NH, T, 1};
    const Dims s_tt = {NH * T * T, T * T, T, 1}, s_t1 = {NH * T, T, 1, 1};
    auto q = g.tensor("Q", kQ, CUDNN_DATA_BFLOAT16, bhtd, qkv_strides(T, C, HS), false);
    auto kt = g.tensor("K^T", kK, CUDNN_DATA_BFLOAT16, bhdt, qkv_strides_t(T, C, HS), false);
    auto v = g.tensor("V", kV, CUDNN_DATA_BFLOAT16, bhtd, qkv_strides(T, C, HS), false);
    auto o = g.tensor("O", kO, CUDNN_DATA_BFLOAT16, bhtd, {T * C, HS, C, 1}, false);
    auto stats = g.tensor("Stats", kStats, CUDNN_DATA_FLOAT, bht1, s_t1, false);
    auto scale = g.scalar("scale", kScale);
    auto neg_inf = g.scalar("-inf", kNegInf);

    auto s = g.virt("Q.K^T", CUDNN_DATA_FLOAT, bhtt, s_tt);
    g.matmul("Q.K^T", q, kt, s);
    auto s_scaled = g.virt("scaled scores", CUDNN_DATA_FLOAT, bhtt, s_tt);
    g.pointwise("scale", CUDNN_POINTWISE_MUL, s, scale, s_scaled);
    auto s_masked = g.causal_mask(s_scaled, neg_inf, bhtt, s_tt);
    auto row_max = g.virt("row max", CUDNN_DATA_FLOAT, bht1, s_t1);
    g.reduction("row max", CUDNN_REDUCE_TENSOR_MAX, s_masked, row_max);
    auto centered = g.virt("scores - max", CUDNN_DATA_FLOAT, bhtt, s_tt);
    g.pointwise("scores - max", CUDNN_POINTWISE_SUB, s_masked, row_max, centered);
    auto e = g.virt("exp", CUDNN_DATA_FLOAT, bhtt, s_tt);
    g.pointwise("exp", CUDNN_POINTWISE_EXP, centered, nullptr, e);
    auto row_sum = g.virt("row sum", CUDNN_DATA_FLOAT, bht1, s_t1);
    g.reduction("row sum", CUDNN_REDUCE_TENSOR_ADD, e, row_sum);
    auto log_sum = g.virt("log row sum", CUDNN_DATA_FLOAT, bht1, s_t1);
    g.pointwise("log row sum", CUDNN_POINTWISE_LOG, row_sum, nullptr, log_sum);
    g.pointwise("stats = max + log sum", CUDNN_POINTWISE_ADD, row_max, log_sum, stats);
    auto p = g.virt("P", CUDNN_DATA_BFLOAT16, bhtt, s_tt);  // the P.V product reads P in the io type
    g.pointwise("P = exp / sum", CUDNN_POINTWISE_DIV, e, row_sum, p);
    g.matmul("P.V", p, v, o);
    return finalize_plan(g, handle, "forward", false);
}

Plan build_backward(cudnnHandle_t handle, int64_t B, int64_t T, int64_t NH, int64_t HS, bool deterministic) {
    const int64_t C = NH * HS;
    GraphBuilder g;
    const Dims bhtd = {B, NH, T, HS}, bhdt = {B, NH, HS, T}, bhtt = {B, NH, T, T}, bht1 = {B, NH, T, 1};
    const Dims s_tt = {NH * T * T, T * T, T, 1}, s_tt_t = {NH * T * T, T * T, 1, T}, s_t1 = {NH * T, T, 1, 1};
    const Dims s_o = {T * C, HS, C, 1};
    auto q = g.tensor("Q", kQ, CUDNN_DATA_BFLOAT16, bhtd, qkv_strides(T, C, HS), false);
    auto kt = g.tensor("K^T", kK, CUDNN_DATA_BFLOAT16, bhdt, qkv_strides_t(T, C, HS), false);
    auto vt = g.tensor("V^T", kV, CUDNN_DATA_BFLOAT16, bhdt, qkv_strides_t(T, C, HS), false);
    auto o = g.tensor("O", kO, CUDNN_DATA_BFLOAT16, bhtd, s_o, false);
    auto d_o = g.tensor("dO", kdO, CUDNN_DATA_BFLOAT16, bhtd, s_o, false);
    auto stats = g.tensor("Stats", kStats, CUDNN_DATA_FLOAT, bht1, s_t1, false);
    auto dq = g.tensor("dQ", kdQ, CUDNN_DATA_BFLOAT16, bhtd, qkv_strides(T, C, HS), false);
    auto dk = g.tensor("dK", kdK, CUDNN_DATA_BFLOAT16, bhtd, qkv_strides(T, C, HS), false);
    auto dv = g.tensor("dV", kdV, CUDNN_DATA_BFLOAT16, bhtd, qkv_strides(T, C, HS), false);
    auto scale = g.scalar("scale", kScale);
    auto neg_inf = g.scalar("-inf", kNegInf);
    auto one = g.scalar("one", kOne);

    // D = sum_row(dO * O): non-virtual, in our workspace (the frontend's softmax_sum)
    auto do_o = g.virt("dO*O", CUDNN_DATA_FLOAT, bhtd, s_o);
    g.pointwise("dO*O", CUDNN_POINTWISE_MUL, d_o, o, do_o);
    auto do_o_sum = g.virt("sum dO*O", CUDNN_DATA_FLOAT, bht1, s_t1);
    g.reduction("sum dO*O", CUDNN_REDUCE_TENSOR_ADD, do_o, do_o_sum);
    auto row_dot = g.tensor("D", kRowDot, CUDNN_DATA_FLOAT, bht1, s_t1, false);
    g.pointwise("D = sum * 1", CUDNN_POINTWISE_MUL, do_o_sum, one, row_dot);

    // P = exp(mask(Q K^T * scale - Stats)) (the frontend's order: mask after the stats)
    auto s = g.virt("Q.K^T", CUDNN_DATA_FLOAT, bhtt, s_tt);
    g.matmul("Q.K^T", q, kt, s);
    auto s_scaled = g.virt("scaled scores", CUDNN_DATA_FLOAT, bhtt, s_tt);
    g.pointwise("scale", CUDNN_POINTWISE_MUL, s, scale, s_scaled);
    auto centered = g.virt("scores - stats", CUDNN_DATA_FLOAT, bhtt, s_tt);
    g.pointwise("scores - stats", CUDNN_POINTWISE_SUB, s_scaled, stats, centered);
    auto c_masked = g.causal_mask(centered, neg_inf, bhtt, s_tt);
    auto p = g.virt("P", CUDNN_DATA_FLOAT, bhtt, s_tt);
    g.pointwise("P = exp", CUDNN_POINTWISE_EXP, c_masked, nullptr, p);

    // dV = P^T dO
    auto pt = g.virt("P^T", CUDNN_DATA_BFLOAT16, bhtt, s_tt_t);
    g.reshape("P^T", p, pt);
    g.matmul("P^T.dO", pt, d_o, dv);

    // dS = P * (dO V^T - D) * scale
    auto dp = g.virt("dO.V^T", CUDNN_DATA_FLOAT, bhtt, s_tt);
    g.matmul("dO.V^T", d_o, vt, dp);
    auto dp_centered = g.virt("dP - D", CUDNN_DATA_FLOAT, bhtt, s_tt);
    g.pointwise("dP - D", CUDNN_POINTWISE_SUB, dp, row_dot, dp_centered);
    auto ds_unscaled = g.virt("P*(dP - D)", CUDNN_DATA_FLOAT, bhtt, s_tt);
    g.pointwise("P*(dP - D)", CUDNN_POINTWISE_MUL, dp_centered, p, ds_unscaled);
    auto ds = g.virt("dS", CUDNN_DATA_FLOAT, bhtt, s_tt);
    g.pointwise("dS scale", CUDNN_POINTWISE_MUL, ds_unscaled, scale, ds);

    // dK = dS^T Q
    auto dst = g.virt("dS^T", CUDNN_DATA_BFLOAT16, bhtt, s_tt_t);
    g.reshape("dS^T", ds, dst);
    g.matmul("dS^T.Q", dst, q, dk);

    // dQ = dS K: written directly (no fp32 accumulator) in the deterministic form, else through an fp32
    // accumulator in our workspace (the frontend's default dQ_accum, which the engine fills with atomics)
    auto k = g.virt("K", CUDNN_DATA_FLOAT, bhtd, qkv_strides(T, C, HS));  // fp32 as the frontend types it
    g.reshape("K", kt, k);
    if (deterministic) {
        g.matmul("dS.K", ds, k, dq);
    } else {
        auto dq_accum = g.tensor("dQ accumulator", kdQAccum, CUDNN_DATA_FLOAT, bhtd, {NH * T * HS, T * HS, HS, 1}, false);
        g.matmul("dS.K", ds, k, dq_accum);
        g.pointwise("dQ = accumulator", CUDNN_POINTWISE_IDENTITY, dq_accum, nullptr, dq);
    }
    return finalize_plan(g, handle, deterministic ? "deterministic backward" : "backward", deterministic);
}

}  // namespace

struct CudnnAttention::Impl {
    cudnnHandle_t handle = nullptr;
    bool want_deterministic = true;  // the backward form asked for
    struct Plans {
        Plan fwd, bwd;
        bool deterministic = true;  // bwd is the deterministic form
    };
    std::map<std::tuple<int, int, int, int>, Plans> plans;
    Plans* current = nullptr;
    std::tuple<int, int, int, int> current_shape{0, 0, 0, 0};
    // [ backward's D (fp32 [B, NH, T]) | dQ accumulator (fp32 [B, NH, T, HS], nondeterministic form only)
    //   | the plan's workspace ], each slot 256-byte rounded
    void* workspace = nullptr;
    size_t workspace_bytes = 0;
    size_t rowdot_bytes = 0, accum_bytes = 0;
    float neg_inf = -std::numeric_limits<float>::infinity();
    float one = 1.0f;

    void* plan_workspace() const { return (char*)workspace + rowdot_bytes + accum_bytes; }

    void execute(cudnnBackendDescriptor_t plan, const std::vector<int64_t>& uids, const std::vector<void*>& ptrs,
                 void* ws, const char* which) {
        Desc pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, std::string(which) + " variant pack");
        SET(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, (int64_t)uids.size(), uids.data());
        SET(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, (int64_t)ptrs.size(), ptrs.data());
        SET(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
        pack.finalize();
        cudnn_check(cudnnBackendExecute(handle, plan, pack.get()), std::string("cudnnBackendExecute(") + which + ")");
    }
};

bool CudnnAttention::available() {
    int devices = 0;
    return cudnnGetVersion() >= 90000 && cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
}

CudnnAttention::CudnnAttention(bool deterministic) : impl_(new Impl) {
    impl_->want_deterministic = deterministic;
    try {
        CUDNN_CHECK(cudnnCreate(&impl_->handle));
    } catch (...) {
        delete impl_;
        throw;
    }
}

bool CudnnAttention::deterministic() const { return impl_->want_deterministic; }

CudnnAttention::~CudnnAttention() {
    for (auto& [shape, p] : impl_->plans) {
        (void)shape;
        p.fwd.keep.clear();
        p.bwd.keep.clear();
    }
    impl_->plans.clear();
    cudaFree(impl_->workspace);
    if (impl_->handle) cudnnDestroy(impl_->handle);
    delete impl_;
}

void CudnnAttention::reserve(int B, int T, int NH, int HS) {
    const auto shape = std::make_tuple(B, T, NH, HS);
    if (impl_->current && impl_->current_shape == shape) return;
    auto it = impl_->plans.find(shape);
    if (it == impl_->plans.end()) {
        Impl::Plans p;
        p.fwd = build_forward(impl_->handle, B, T, NH, HS);
        p.deterministic = impl_->want_deterministic;
        try {
            p.bwd = build_backward(impl_->handle, B, T, NH, HS, p.deterministic);
        } catch (const Error& e) {
            if (!p.deterministic) throw;
            std::fprintf(stderr, "cuDNN attention: no deterministic backward for B=%d T=%d NH=%d HS=%d (%s); "
                         "using the fp32-accumulator form, whose dQ may differ run to run\n", B, T, NH, HS, e.what());
            p.bwd = build_backward(impl_->handle, B, T, NH, HS, false);
            p.deterministic = false;
        }
        it = impl_->plans.emplace(shape, std::move(p)).first;
    }
    auto round256 = [](size_t n) { return (n + 255) / 256 * 256; };
    const size_t rowdot = round256((size_t)B * NH * T * sizeof(float));
    const size_t accum = it->second.deterministic ? 0 : round256((size_t)B * NH * T * HS * sizeof(float));
    const size_t need = rowdot + accum + (size_t)std::max(it->second.fwd.workspace, it->second.bwd.workspace);
    if (need > impl_->workspace_bytes) {
        CUDA_CHECK(cudaFree(impl_->workspace));
        impl_->workspace = nullptr;
        impl_->workspace_bytes = 0;
        CUDA_CHECK(cudaMalloc(&impl_->workspace, need));
        impl_->workspace_bytes = need;
    }
    impl_->rowdot_bytes = rowdot;
    impl_->accum_bytes = accum;
    impl_->current = &it->second;
    impl_->current_shape = shape;
}

void CudnnAttention::forward(bf16* out, float* lse, const bf16* qkv, int B, int T, int NH, int HS,
                             cudaStream_t stream) {
    reserve(B, T, NH, HS);
    const long C = (long)NH * HS;
    float scale = 1.0f / std::sqrt((float)HS);
    CUDNN_CHECK(cudnnSetStream(impl_->handle, stream));
    bf16* q = const_cast<bf16*>(qkv);
    const std::vector<int64_t> uids = {kQ, kK, kV, kO, kStats, kScale, kNegInf};
    const std::vector<void*> ptrs = {q, q + C, q + 2 * C, out, lse, &scale, &impl_->neg_inf};
    impl_->execute(impl_->current->fwd.plan, uids, ptrs, impl_->plan_workspace(), "forward");
}

void CudnnAttention::backward(bf16* dqkv, const bf16* dout, const bf16* qkv, const bf16* out, const float* lse, int B,
                              int T, int NH, int HS, cudaStream_t stream) {
    reserve(B, T, NH, HS);
    const long C = (long)NH * HS;
    float scale = 1.0f / std::sqrt((float)HS);
    CUDNN_CHECK(cudnnSetStream(impl_->handle, stream));
    bf16* q = const_cast<bf16*>(qkv);
    std::vector<int64_t> uids = {kQ, kK, kV, kO, kdO, kStats, kdQ, kdK, kdV, kRowDot, kScale, kNegInf, kOne};
    std::vector<void*> ptrs = {q,
                                     q + C,
                                     q + 2 * C,
                                     const_cast<bf16*>(out),
                                     const_cast<bf16*>(dout),
                                     const_cast<float*>(lse),
                                     dqkv,
                                     dqkv + C,
                                     dqkv + 2 * C,
                                     impl_->workspace,
                                     &scale,
                                     &impl_->neg_inf,
                                     &impl_->one};
    if (!impl_->current->deterministic) {
        uids.push_back(kdQAccum);
        ptrs.push_back((char*)impl_->workspace + impl_->rowdot_bytes);
    }
    impl_->execute(impl_->current->bwd.plan, uids, ptrs, impl_->plan_workspace(), "backward");
}

}  // namespace codagpt
