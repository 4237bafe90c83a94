"""The fixes made to ik_llama.cpp's tree before the embedded llama-server is built from it: each an exact
replacement with its reason, found as often as expected or the build stops (another sdist version must be
looked at, not built without them). Build your own ik with the same fixes (docs/servers.md)."""

from __future__ import annotations

from lanes_pipeline.embedded.source_patches import SourcePatch

# ik's llama_kv_cache_seq_pos_min returned the position of the first cell (in cache order) of a sequence,
# not the smallest position. With two slots sharing the KV cache, slot 1's cells interleave with slot 0's,
# so a later request on slot 1 that shares a prefix saw pos_min near the end of its cache and was "forcing
# full prompt re-processing due to lack of cache data": measured on 4 groups of 16 requests sharing a
# prefix, 4-7 of each group's 15 followers re-evaluated the whole prefix, always on slot 1.
IK_PATCHES = (
    SourcePatch(
        path="src/llama.cpp",
        old="""        if (cache.cells[i].has_seq_id(seq_id)) {
            result = cache.cells[i].pos;
            break;
        }""",
        new="""        if (cache.cells[i].has_seq_id(seq_id) && (result < 0 || cache.cells[i].pos < result)) {
            result = cache.cells[i].pos;  // lanes_pipeline: the smallest position, not the first cell's
        }""",
        why="llama_kv_cache_seq_pos_min: the smallest position of the sequence, not its first cell's",
    ),
    # ik's handlers of the slot actions (save, restore, erase: slot_copy.py), of the LoRA scales and of the
    # control vectors post their task and only then register to wait for its answer. When the server's loop
    # is idle it runs the task and sends the answer before the handler registers: the answer is dropped, the
    # handler waits forever and its HTTP thread is lost. The pool has max(slots + 2, cores - 1) threads, so
    # on 2 cores with 2 slots a server that lost two served one request at a time for the rest of its life.
    # Its completion handlers register first, as upstream's do everywhere; so do these now.
    SourcePatch(
        path="examples/server/server.cpp",
        old="""        const int id_task = ctx_server.queue_tasks.post(std::move(task));
        ctx_server.queue_results.add_waiting_task_id(id_task);
""",
        new="""        const int id_task = task.id = ctx_server.queue_tasks.get_new_id();  // lanes_pipeline
        ctx_server.queue_results.add_waiting_task_id(id_task);
        ctx_server.queue_tasks.post(std::move(task));
""",
        why="slot, LoRA and control-vector actions register for their answer before posting the task",
        occurrences=7,
    ),
    # ik's llama graph (Llama, Mistral, and Mixtral: a llama GGUF with experts) adds each layer's residual
    # inside its FFN builders (add_input) instead of after them. The dense builder is given the layer's input
    # and normalises it itself; the MoE builder is given the input already normalised (ffn_norm), so it added
    # the normalised hidden state as the residual, not the hidden state: every llama-architecture MoE answered
    # gibberish ("chartedchartedcharted..." from SmolLM2 upcycled into 4 identical experts, whose answers
    # must be the dense model's; the same GGUF on upstream llama-server answers as the dense model does).
    SourcePatch(
        path="src/llama-build-context.cpp",
        old="""                    LLM_EXPERT_GATING_FUNC_SOFTMAX,
                    cb, il, gf, true);
            cb(cur, "ffn_moe_out", il);
""",
        new="""                    LLM_EXPERT_GATING_FUNC_SOFTMAX,
                    cb, il, gf, false);
            cur = ggml_add(ctx0, cur, ffn_inp);  // lanes_pipeline: the residual is the layer's input
            cb(cur, "ffn_moe_out", il);
""",
        why="a llama-architecture MoE layer adds its input as the residual, not the normalised input",
    ),
    # A request with a grammar (a `json_schema` is one) whose sampler picks an end-of-generation token
    # before the grammar is complete aborts the whole server (GGML_ABORT in llama_grammar_accept_impl),
    # dropping every request on it. The sampler applies the grammar, so it picks such a token only from
    # logits that are all equal or NaN (the first token id wins, `<|endoftext|>` for SmolLM2): seen twice
    # on 2 busy cores, each the first token after a prompt evaluated on top of part of a slot's cache,
    # each after "Resampling because token 0 ... does not meet grammar rules". The answer now ends there
    # instead (the client's parsing rejects the unfinished text, as it does any cut answer), and the server
    # lives on.
    SourcePatch(
        path="src/llama-grammar.cpp",
        old="""            if (stack.empty()) {
                return;
            }
        }
        GGML_ABORT("fatal error");
""",
        new="""            if (stack.empty()) {
                return;
            }
        }
        // lanes_pipeline: end this answer unfinished rather than abort the server and every request on it
        LLAMA_LOG_WARN("%s: end of generation before the grammar was complete: the answer ends here\\n",
                       __func__);
        return;
""",
        why="an end of generation before the grammar is complete ends the answer, not the server",
    ),
    # A slot action that fails (a slot that does not exist, a restore with no room or no file) is answered
    # with send_error, which queues the new kind of result; the slot handlers wait for the legacy kind, so
    # the failure is never answered and its HTTP thread is lost (every failed restore, measured). The
    # failures now answer in the kind their handlers wait for: a 400 with ik's own message.
    *(
        SourcePatch(
            path="examples/server/server-context.cpp",
            old=f'            send_error(task, "{message}", ERROR_TYPE_INVALID_REQUEST);\n',
            new=(
                "            {  // lanes_pipeline: the legacy result the slot handlers wait for\n"
                "                server_task_result failed;\n"
                "                failed.id = task.id;\n"
                "                failed.stop = true;\n"
                "                failed.error = true;\n"
                f'                failed.data = format_error_response("{message}",\n'
                "                                                    ERROR_TYPE_INVALID_REQUEST);\n"
                "                queue_results.send(failed);\n"
                "            }\n"
            ),
            why=f"a failed slot action answers ({message})",
            occurrences=occurrences,
        )
        for message, occurrences in (
            ("Invalid slot ID", 3),
            ("Unable to restore slot, no available space in KV cache or invalid slot save file", 1),
        )
    ),
)
