package org.edgeflash.llm

/** One pass through the chain: `method` over `width` token slots at `pos`, the first `real` of them real. */
data class Pass(val method: String, val pos: Int, val width: Int, val real: Int)

/**
 * How appending `count` tokens at `pos` splits into passes, as export/targets/runner.py does:
 * pieces of the prefill method's token count (padded at the end when shapes are static), and
 * `decode` for a single token or when a padded piece would run past the cache.
 */
fun feedPlan(pos: Int, count: Int, prefillTokens: Int, cacheLen: Int, staticShapes: Boolean): List<Pass> {
    require(count >= 1) { "feed needs at least one token" }
    require(pos + count <= cacheLen) { "context full: $pos cached + $count new tokens > cache length $cacheLen" }
    val out = ArrayList<Pass>()
    var p = pos
    var i = 0
    while (i < count) {
        val rest = count - i
        val take = minOf(prefillTokens, rest)
        val width = if (staticShapes) prefillTokens else take
        if (rest == 1 || p + width > cacheLen) {
            out.add(Pass("decode", p, 1, 1)); p += 1; i += 1
        } else {
            out.add(Pass("prefill", p, width, take)); p += take; i += take
        }
    }
    return out
}
