#include "common.hpp"

#include <nlohmann/json.hpp>

namespace codagpt {

std::string one_line(const std::string& s) {
    const std::string q = nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    return q.substr(1, q.size() - 2);
}

}  // namespace codagpt
