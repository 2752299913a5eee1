// The shipped tools' hooks: none (generate_hooks.h).
#include "dlo/app/generate_hooks.h"

namespace dlo {
namespace {

class NoHooks final : public GenerateHooks {
 public:
  void add_flags(cxxopts::Options&) const override {}
  void apply(const cxxopts::ParseResult&, const MpiWorld&, GenerateOptions&) const override {}
  std::unique_ptr<BatchWork> work(const cxxopts::ParseResult&, const MpiWorld& world, const ModelInfo& model,
                                  const GenerateOptions& options, GenerateCallbacks&) const override {
    return make_model_work(world, model, options);
  }
};

}  // namespace

const GenerateHooks& generate_hooks() {
  static const NoHooks hooks;
  return hooks;
}

}  // namespace dlo
