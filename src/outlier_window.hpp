// The outlier guard of the step loop (config keys skip_loss_z, skip_grad_z, outlier_window): the
// recent values of a training signal (the loss, the gradient norm) and how far a new value lies
// above them.
#pragma once
#include <cmath>
#include <cstddef>
#include <deque>
#include <limits>
#include <vector>

namespace codagpt {

class OutlierWindow {
public:
    explicit OutlierWindow(size_t size) : size_(size) {}

    // How many standard deviations x lies above the mean of the window (negative below it; the
    // population standard deviation, summed in order, so the same values give the same bits).
    // NaN until the window is full, and when its values are all equal.
    double z(double x) const {
        if (values_.empty() || values_.size() < size_) return std::numeric_limits<double>::quiet_NaN();
        double mean = 0, var = 0;
        for (double v : values_) mean += v;
        mean /= double(values_.size());
        for (double v : values_) var += (v - mean) * (v - mean);
        var /= double(values_.size());
        return var > 0 ? (x - mean) / std::sqrt(var) : std::numeric_limits<double>::quiet_NaN();
    }
    // Appends x, dropping the oldest value once the window is full.
    void push(double x) {
        values_.push_back(x);
        while (values_.size() > size_) values_.pop_front();
    }
    // Oldest first: what a checkpoint keeps.
    std::vector<double> values() const { return {values_.begin(), values_.end()}; }
    // A checkpoint's values (oldest first); a smaller window keeps the newest.
    void restore(const std::vector<double>& values) {
        values_.clear();
        for (double v : values) push(v);
    }

private:
    size_t size_;
    std::deque<double> values_;
};

}  // namespace codagpt
