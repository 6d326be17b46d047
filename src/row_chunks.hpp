// Cutting a run of rows into as few consecutive chunks as a cap allows, where their summed cost is
// least: the fused GPU model's LM head, which works its M rows a chunk at a time
// (model_coda_gpu.cu), cuts them where its chunks' dX GEMMs fill the SMs' rounds of tiles best.
#pragma once
#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common.hpp"

namespace codagpt {

// The chunk sizes, first to last, covering `total` rows: each at most `cap` rows and a multiple of
// `align` rows but the last (which takes the rest), as few chunks as that allows, and of those cuts
// one whose summed cost(rows) is least. A dynamic program over the multiples of align; cost is
// called once for each chunk size it prices. total >= 1, align >= 1, cap >= align.
inline std::vector<int> fewest_row_chunks(int total, int align, int cap, const std::function<double(int)>& cost) {
    if (total < 1 || align < 1 || cap < align)
        throw Error("fewest_row_chunks: needs total >= 1, align >= 1 and cap >= align, got " + std::to_string(total) +
                    ", " + std::to_string(align) + ", " + std::to_string(cap));
    const int blocks = (total + align - 1) / align, most = cap / align;
    std::map<int, double> priced;
    auto price = [&](int rows) {
        auto it = priced.find(rows);
        return it != priced.end() ? it->second : priced[rows] = cost(rows);
    };
    // best[j]: the best cut of the first j blocks (fewest chunks, then least cost), its last chunk
    // `last[j]` blocks
    struct Cut {
        int chunks;
        double cost;
    };
    std::vector<Cut> best(blocks + 1, Cut{0, 0.0});
    std::vector<int> last(blocks + 1, 0);
    for (int j = 1; j <= blocks; j++) {
        const int end_row = std::min(j * align, total);
        for (int b = 1; b <= std::min(most, j); b++) {
            const Cut c{best[j - b].chunks + 1, best[j - b].cost + price(end_row - (j - b) * align)};
            if (last[j] == 0 || c.chunks < best[j].chunks || (c.chunks == best[j].chunks && c.cost < best[j].cost)) {
                best[j] = c;
                last[j] = b;
            }
        }
    }
    std::vector<int> rows;
    for (int j = blocks; j > 0; j -= last[j]) rows.push_back(std::min(j * align, total) - (j - last[j]) * align);
    std::reverse(rows.begin(), rows.end());
    return rows;
}

}  // namespace codagpt
