// The names of the enumerations of model/roles.hpp, as the plan, inspect and
// the reports print them.
#include "ctquant/model/roles.hpp"

namespace ctquant {

const char* role_name(ModuleRole role) {
  switch (role) {
    case ModuleRole::kLinear:
      return "linear";
    case ModuleRole::kExpert:
      return "expert";
    case ModuleRole::kStackedExperts:
      return "stacked experts";
    case ModuleRole::kEmbedding:
      return "embedding";
    case ModuleRole::kHead:
      return "output head";
    case ModuleRole::kRouter:
      return "router";
    case ModuleRole::kSharedExpertGate:
      return "shared-expert gate";
    case ModuleRole::kPlainLinear:
      return "plain linear";
    case ModuleRole::kDraftKeep:
      return "draft module kept";
    case ModuleRole::kNorm:
      return "norm";
    case ModuleRole::kParameter:
      return "parameter";
  }
  return "?";
}

const char* component_name(Component component) {
  switch (component) {
    case Component::kLanguage:
      return "language model";
    case Component::kVision:
      return "vision tower";
    case Component::kAudio:
      return "audio tower";
    case Component::kProjector:
      return "projector";
    case Component::kMtp:
      return "MTP layer";
    case Component::kDraft:
      return "draft model";
  }
  return "?";
}

const char* vllm_build_name(VllmBuild build) {
  switch (build) {
    case VllmBuild::kQuantizable:
      return "quantizable";
    case VllmBuild::kIfTargeted:
      return "quantized only if targeted";
    case VllmBuild::kPlain:
      return "always 16-bit";
  }
  return "?";
}

const char* default_action_name(DefaultAction action) {
  switch (action) {
    case DefaultAction::kQuantize:
      return "quantize";
    case DefaultAction::kKeep:
      return "keep";
    case DefaultAction::kRefuse:
      return "refuse";
  }
  return "?";
}

const char* orientation_name(StackedExperts::Orientation orientation) {
  switch (orientation) {
    case StackedExperts::Orientation::kOutIn:
      return "[E, out, in]";
    case StackedExperts::Orientation::kInOut:
      return "[E, in, out]";
    case StackedExperts::Orientation::kUnknown:
      return "unknown";
  }
  return "?";
}

const char* proof_name(StackedExperts::Proof proof) {
  switch (proof) {
    case StackedExperts::Proof::kShape:
      return "proven by the dims";
    case StackedExperts::Proof::kSibling:
      return "proven by the layer's other stacked tensor";
    case StackedExperts::Proof::kFamily:
      return "the family's documented layout, not proven by the dims";
    case StackedExperts::Proof::kNone:
      return "not proven";
  }
  return "?";
}

}  // namespace ctquant
