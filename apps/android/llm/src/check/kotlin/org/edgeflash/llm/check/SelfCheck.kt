package org.edgeflash.llm.check

import org.edgeflash.llm.Json
import org.edgeflash.llm.KvCache
import org.edgeflash.llm.Manifest
import org.edgeflash.llm.Pass
import org.edgeflash.llm.SamplingParams
import org.edgeflash.llm.feedPlan

/** Checks of the plain logic that need no Python twin; each returns null when it holds. */
object SelfCheck {
    fun run(): Map<String, String?> = linkedMapOf(
        "feed_plan_pieces" to guard(::feedPlanPieces),
        "feed_plan_near_cache_end" to guard(::feedPlanNearEnd),
        "kv_write_places_entries" to guard(::kvWrite),
        "bad_manifest_errors_name_the_field" to guard(::badManifest),
        "bad_sampling_params_rejected" to guard(::badParams),
        "json_unicode_escapes" to guard(::jsonEscapes),
    )

    /** A check that throws fails alone, with the exception as its message. */
    private fun guard(check: () -> String?): String? = try { check() } catch (e: Exception) { e.toString() }

    private fun feedPlanPieces(): String? {
        val plan = feedPlan(0, 19, 8, 64, staticShapes = true)
        val want = listOf(Pass("prefill", 0, 8, 8), Pass("prefill", 8, 8, 8), Pass("prefill", 16, 8, 3))
        return if (plan == want) null else "got $plan"
    }

    private fun feedPlanNearEnd(): String? {
        // 5 tokens at 60 of 64: a padded piece of 8 would pass the end, so they go one by one.
        val plan = feedPlan(60, 4, 8, 64, staticShapes = true)
        if (plan.any { it.method != "decode" } || plan.size != 4) return "got $plan"
        return try { feedPlan(62, 3, 8, 64, true); "feeding past the cache was accepted" } catch (e: IllegalArgumentException) { null }
    }

    private fun kvWrite(): String? {
        val c = KvCache(1, 2, 6, 3)
        val fresh = KvCache.direct(2 * 4 * 3) // [H=2, T=4, D=3], 2 of 4 rows real
        for (i in 0 until fresh.capacity()) fresh.put(i, (i + 1).toFloat())
        c.write(c.k[0], fresh, tokens = 4, pos = 3, real = 2)
        for (h in 0 until 2) for (p in 0 until 6) for (d in 0 until 3) {
            val got = c.k[0].get((h * 6 + p) * 3 + d)
            val want = if (p in 3..4) ((h * 4 + (p - 3)) * 3 + d + 1).toFloat() else 0f
            if (got != want) return "k[$h, $p, $d] = $got, expected $want"
        }
        return null
    }

    private fun badManifest(): String? {
        val cases = mapOf(
            "{\"format\": \"other\"}" to "format",
            "{\"format\": \"edgeflash-target\", \"version\": 9}" to "version 9",
            "not json" to "not valid JSON",
        )
        for ((text, needle) in cases) {
            try { Manifest.parse(text); return "accepted $text" } catch (e: IllegalArgumentException) {
                if (e.message?.contains(needle) != true) return "error for $text: ${e.message}"
            }
        }
        return null
    }

    private fun badParams(): String? {
        for (make in listOf({ SamplingParams(temperature = -1.0) }, { SamplingParams(topP = 0.0) }, { SamplingParams(minP = 1.0) })) {
            try { make(); return "accepted bad parameters" } catch (e: IllegalArgumentException) { }
        }
        return null
    }

    private fun jsonEscapes(): String? {
        val s = Json.parse("\"\\u2581a\\ud83d\\ude00\"") as String
        return if (s == "\u2581a\uD83D\uDE00") null else "got $s"
    }
}
