"""The span schema: every attribute name lightning-otel writes or reads, in one place.

Everyone imports names from here (instrument, collector, trainer, dashboards, tests); no module
spells an attribute name as a string of its own. `docs/span-schema.md` documents each name and
who reads it; `tests/core/test_schema.py` checks that the two agree.

Two namespaces:
- OpenInference (`openinference.*`, `llm.*`, `tool.*`, ...): what the OpenInference
  instrumentors already write, so Phoenix, Arize and friends read our traces as theirs.
- `lightning.*`: what training needs and OpenInference lacks (rollout identity, rewards,
  policy version, token ids, logprobs).

This module is imported by the agent side, so it stays dependency-free.
"""

from __future__ import annotations

# --- OpenInference (values pinned against openinference-semantic-conventions in tests) -------
OPENINFERENCE_SPAN_KIND = "openinference.span.kind"
LLM_MODEL_NAME = "llm.model_name"
LLM_PROVIDER = "llm.provider"
LLM_SYSTEM = "llm.system"
LLM_INVOCATION_PARAMETERS = "llm.invocation_parameters"
LLM_TOKEN_COUNT_PROMPT = "llm.token_count.prompt"
LLM_TOKEN_COUNT_COMPLETION = "llm.token_count.completion"
LLM_TOKEN_COUNT_TOTAL = "llm.token_count.total"
TOOL_NAME = "tool.name"
TOOL_PARAMETERS = "tool.parameters"
INPUT_VALUE = "input.value"
INPUT_MIME_TYPE = "input.mime_type"
OUTPUT_VALUE = "output.value"
OUTPUT_MIME_TYPE = "output.mime_type"
SESSION_ID = "session.id"
AGENT_NAME = "agent.name"
# Messages, flattened: f"{LLM_INPUT_MESSAGES}.{i}.{MESSAGE_ROLE}" = "user" (message_attribute below).
LLM_INPUT_MESSAGES = "llm.input_messages"
LLM_OUTPUT_MESSAGES = "llm.output_messages"
MESSAGE_ROLE = "message.role"
MESSAGE_CONTENT = "message.content"
MESSAGE_NAME = "message.name"
MESSAGE_TOOL_CALL_ID = "message.tool_call_id"
MESSAGE_TOOL_CALLS = "message.tool_calls"  # .{j}.tool_call.id / .function.name / .function.arguments
TOOL_CALL_ID = "tool_call.id"
TOOL_CALL_FUNCTION_NAME = "tool_call.function.name"
TOOL_CALL_FUNCTION_ARGUMENTS = "tool_call.function.arguments"
MESSAGE_CONTENTS = "message.contents"  # .{j}.message_content.type / .text (content given as parts)
MESSAGE_CONTENT_TYPE = "message_content.type"
MESSAGE_CONTENT_TEXT = "message_content.text"

REDACTED = "__REDACTED__"  # OpenInference's mask for hidden text


def message_attribute(messages: str, index: int, field: str) -> str:
    """The flattened name of one message field: ("llm.input_messages", 0, MESSAGE_ROLE) ->
    "llm.input_messages.0.message.role"."""
    return f"{messages}.{index}.{field}"


# OpenInference span kinds we use.
KIND_LLM = "LLM"
KIND_TOOL = "TOOL"
KIND_AGENT = "AGENT"
KIND_CHAIN = "CHAIN"
KIND_EVALUATOR = "EVALUATOR"  # a reward is an evaluation of the rollout

# --- OpenTelemetry GenAI semantic conventions (gen_ai.*) -----------------------------------
# What opentelemetry-instrumentation-openai-v2, OpenLLMetry, Pydantic AI and most backends speak.
# Read by the collector's views (as well as OpenInference's names); written by instrument() and
# the gateway when asked (docs/span-schema.md, "GenAI semantic conventions").
# Two shapes exist: v1.36 (`gen_ai.system`, messages as log events or not at all) and the latest
# experimental one, opted into with OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental
# (`gen_ai.provider.name`, messages as JSON "parts" in gen_ai.input.messages / gen_ai.output.messages).
SEMCONV_STABILITY_OPT_IN_ENV = "OTEL_SEMCONV_STABILITY_OPT_IN"
SEMCONV_GEN_AI_LATEST = "gen_ai_latest_experimental"
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"  # latest; v1.36 and older: gen_ai.system
GEN_AI_SYSTEM = "gen_ai.system"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"  # string[]
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_REQUEST_SEED = "gen_ai.request.seed"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"  # JSON: [{"role", "parts": [{"type", ...}]}]
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"  # JSON: [{"role", "parts", "finish_reason"}]
GEN_AI_SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"  # JSON parts
GEN_AI_TOOL_DEFINITIONS = "gen_ai.tool.definitions"
GEN_AI_TOOL_NAME = "gen_ai.tool.name"
GEN_AI_TOOL_CALL_ID = "gen_ai.tool.call.id"
GEN_AI_TOOL_TYPE = "gen_ai.tool.type"
GEN_AI_TOOL_DESCRIPTION = "gen_ai.tool.description"
GEN_AI_TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"
GEN_AI_TOOL_CALL_RESULT = "gen_ai.tool.call.result"
GEN_AI_AGENT_NAME = "gen_ai.agent.name"
GEN_AI_AGENT_ID = "gen_ai.agent.id"
GEN_AI_CONVERSATION_ID = "gen_ai.conversation.id"
GEN_AI_OUTPUT_TYPE = "gen_ai.output.type"
# gen_ai.operation.name values.
GEN_AI_OP_CHAT = "chat"
GEN_AI_OP_TEXT_COMPLETION = "text_completion"
GEN_AI_OP_GENERATE_CONTENT = "generate_content"
GEN_AI_OP_EXECUTE_TOOL = "execute_tool"
GEN_AI_OP_INVOKE_AGENT = "invoke_agent"
GEN_AI_OP_CREATE_AGENT = "create_agent"
GEN_AI_OP_EMBEDDINGS = "embeddings"
# The operations that are one model call (an LLM span in OpenInference's terms).
GEN_AI_MODEL_CALL_OPERATIONS = (GEN_AI_OP_CHAT, GEN_AI_OP_TEXT_COMPLETION, GEN_AI_OP_GENERATE_CONTENT)

# OpenTelemetry resource attribute.
SERVICE_NAME = "service.name"
# OpenTelemetry semantic conventions: the server that answered (the gateway's replica).
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"

# --- GenAI conventions: the further names and values instrument() and the gateway write when asked
# (docs/span-schema.md, "Writing GenAI semantic conventions"; pinned against opentelemetry-semantic-conventions
# in tests/instrument/test_gen_ai_output.py).
GEN_AI_REQUEST_FREQUENCY_PENALTY = "gen_ai.request.frequency_penalty"
GEN_AI_REQUEST_PRESENCE_PENALTY = "gen_ai.request.presence_penalty"
GEN_AI_REQUEST_STOP_SEQUENCES = "gen_ai.request.stop_sequences"  # string[]
GEN_AI_REQUEST_CHOICE_COUNT = "gen_ai.request.choice.count"
GEN_AI_REQUEST_STREAM = "gen_ai.request.stream"  # latest shape only
ERROR_TYPE = "error.type"  # OpenTelemetry's general attribute: the class of error a failed operation ended with
GEN_AI_PROVIDER_OPENAI = "openai"  # the OpenAI API's flavour, whichever server answers it (vLLM here)
GEN_AI_PROVIDER_OTHER = "_OTHER"  # invoke_agent spans of our rollouts and agents: no one provider
GEN_AI_TOOL_TYPE_FUNCTION = "function"  # a tool the client runs: what @tool marks
# The two shapes instrument(gen_ai_conventions=...) and the gateway write.
GEN_AI_SHAPE_V1_36 = "v1.36"
GEN_AI_SHAPE_LATEST = "latest"

# --- lightning.* : rollout identity (set on the rollout span and copied onto every span
# started inside it, so SQL can group any span by rollout without walking the tree) --------
ROLLOUT_ID = "lightning.rollout.id"
TASK_ID = "lightning.task.id"  # the GRPO group key
ATTEMPT = "lightning.rollout.attempt"
ROLLOUT_ROOT = "lightning.rollout.root"  # bool, true only on the rollout's own span
# Which split a rollout is in: absent means SPLIT_TRAIN; SPLIT_EVAL rollouts are never trained on
# (the `rollouts` view's `split`, the `reward_by_version` view).
ROLLOUT_SPLIT = "lightning.rollout.split"
SPLIT_TRAIN = "train"
SPLIT_EVAL = "eval"
SPLITS = (SPLIT_TRAIN, SPLIT_EVAL)

# --- rewards: one EVALUATOR span per reward report --------------------------------------
REWARD_NAME = "lightning.reward.name"
REWARD_VALUE = "lightning.reward.value"
DEFAULT_REWARD_NAME = "reward"

# --- policy / weights --------------------------------------------------------------------
POLICY_VERSION = "lightning.policy.version"  # vLLM weight version that served the call

# --- what training needs from each LLM call (choice 0) ------------------------------------
# Each comes in two encodings; the collector decodes both into the same list columns:
# - plain OTLP arrays (int[] / double[]): what any OpenTelemetry SDK can send;
# - packed: little-endian int32 / float64 as a bytes value, or that byte string in base64 for
#   SDKs without bytes attributes (core/lightning_otel/core/token_encoding.py). instrument() sends packed,
#   because the collector turns it into a list column without per-token Python work.
PROMPT_TOKEN_IDS = "lightning.llm.prompt_token_ids"  # int[]
COMPLETION_TOKEN_IDS = "lightning.llm.completion_token_ids"  # int[]
COMPLETION_LOGPROBS = "lightning.llm.completion_logprobs"  # double[], one per completion id
PACKED_PROMPT_TOKEN_IDS = "lightning.llm.packed.prompt_token_ids"  # bytes: int32 little-endian
PACKED_COMPLETION_TOKEN_IDS = "lightning.llm.packed.completion_token_ids"  # bytes: int32 little-endian
PACKED_COMPLETION_LOGPROBS = "lightning.llm.packed.completion_logprobs"  # bytes: float64 little-endian
FINISH_REASON = "lightning.llm.finish_reason"

# --- merge diagnostics: one span per boundary between consecutive calls, written by the trainer -----
MERGE_ROLLOUT = "lightning.merge.rollout_id"  # not lightning.rollout.id: not a span of the rollout
MERGE_MERGED = "lightning.merge.merged"  # bool
MERGE_POSITION = "lightning.merge.position"  # int: first divergent token index (failed boundaries)
MERGE_CAUSE = "lightning.merge.cause"  # retokenized, template_changed, context_rewritten, ...
MERGE_REGION = "lightning.merge.region"  # where the divergence fell: prompt, first_message, completion
MERGE_DETAIL = "lightning.merge.detail"
MERGE_CHAIN = "lightning.merge.chain"  # int: chain index within the rollout
MERGE_PREV_SPAN = "lightning.merge.prev_span_id"
MERGE_NEXT_SPAN = "lightning.merge.next_span_id"

# --- input diagnostics: what the trainer left out of the loss and why, one span per call or rollout --
INPUT_ROLLOUT = "lightning.input.rollout_id"  # not lightning.rollout.id: not a span of the rollout
INPUT_SPAN = "lightning.input.span_id"  # the LLM call whose tokens were masked (absent for a rollout)
INPUT_CAUSE = "lightning.input.cause"  # invalid_behaviour_logprobs, non_finite_reward, non_finite_gradient, ...
INPUT_TOKENS = "lightning.input.tokens"  # int: completion tokens masked out of the loss
INPUT_EXCLUDED = "lightning.input.excluded"  # bool: the whole rollout was left out of training for good
INPUT_DETAIL = "lightning.input.detail"

# --- training steps: one span per optimizer step, written by the training job ---------------------
TRAIN_STEP = "lightning.train.step"  # int
TRAIN_VERSION = "lightning.train.version"  # the policy version the step produced
TRAIN_ROLLOUTS = "lightning.train.rollouts"
TRAIN_SAMPLES = "lightning.train.samples"
TRAIN_MEAN_REWARD = "lightning.train.mean_reward"
TRAIN_LOSS = "lightning.train.loss"
TRAIN_CLIP_FRACTION = "lightning.train.clip_fraction"
TRAIN_ENTROPY = "lightning.train.entropy"
TRAIN_KL = "lightning.train.kl"
TRAIN_GRAD_NORM = "lightning.train.grad_norm"
TRAIN_SWAP_SECONDS = "lightning.train.swap_seconds"
TRAIN_MERGE_RATE = "lightning.train.merge_rate"
TRAIN_MASKED_CALLS = "lightning.train.masked_calls"  # int: calls with behaviour logprobs masked out
TRAIN_MASKED_TOKENS = "lightning.train.masked_tokens"  # int: tokens masked out of the loss
# int[]: element k = how many of the step's rollouts became k + 1 training samples
TRAIN_SAMPLES_PER_ROLLOUT = "lightning.train.samples_per_rollout"

# --- the SDK's own health, on each rollout root span --------------------------------------------
# Spans this process dropped so far (export queue full), cumulative; with the resource's
# service.instance.id, SQL sums the latest value per process.
SDK_DROPPED_SPANS = "lightning.sdk.dropped_spans"
# Private OpenAI / OpenTelemetry SDK internals this process found missing (a newer SDK laid out
# differently) and replaced by their slower public fallback; absent when none (docs/agent-side.md).
SDK_FALLBACKS = "lightning.sdk.fallbacks"
SERVICE_INSTANCE_ID = "service.instance.id"  # OpenTelemetry resource attribute, one per process

# Span names we create.
SPAN_ROLLOUT = "rollout"
SPAN_REWARD = "reward"
SPAN_MERGE_BOUNDARY = "merge_boundary"
SPAN_TRAIN_STEP = "train_step"
SPAN_INPUT_DIAGNOSTIC = "input_diagnostic"

# The attributes copied from the rollout context onto every span started inside a rollout.
ROLLOUT_CONTEXT_ATTRIBUTES = (ROLLOUT_ID, TASK_ID, ATTEMPT)

# Every attribute we write ourselves (docs/span-schema.md must document each).
LIGHTNING_ATTRIBUTES = (
    ROLLOUT_ID,
    TASK_ID,
    ATTEMPT,
    ROLLOUT_ROOT,
    ROLLOUT_SPLIT,
    REWARD_NAME,
    REWARD_VALUE,
    POLICY_VERSION,
    PROMPT_TOKEN_IDS,
    COMPLETION_TOKEN_IDS,
    COMPLETION_LOGPROBS,
    PACKED_PROMPT_TOKEN_IDS,
    PACKED_COMPLETION_TOKEN_IDS,
    PACKED_COMPLETION_LOGPROBS,
    FINISH_REASON,
    MERGE_ROLLOUT,
    MERGE_MERGED,
    MERGE_POSITION,
    MERGE_CAUSE,
    MERGE_REGION,
    MERGE_DETAIL,
    MERGE_CHAIN,
    MERGE_PREV_SPAN,
    MERGE_NEXT_SPAN,
    INPUT_ROLLOUT,
    INPUT_SPAN,
    INPUT_CAUSE,
    INPUT_TOKENS,
    INPUT_EXCLUDED,
    INPUT_DETAIL,
    TRAIN_STEP,
    TRAIN_VERSION,
    TRAIN_ROLLOUTS,
    TRAIN_SAMPLES,
    TRAIN_MEAN_REWARD,
    TRAIN_LOSS,
    TRAIN_CLIP_FRACTION,
    TRAIN_ENTROPY,
    TRAIN_KL,
    TRAIN_GRAD_NORM,
    TRAIN_SWAP_SECONDS,
    TRAIN_MERGE_RATE,
    TRAIN_SAMPLES_PER_ROLLOUT,
    TRAIN_MASKED_CALLS,
    TRAIN_MASKED_TOKENS,
    SDK_DROPPED_SPANS,
    SDK_FALLBACKS,
)
