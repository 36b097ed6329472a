# Sourced by scripts/setup.sh and scripts/test.sh: per-machine copies of what every fresh
# clone would otherwise build again (the built lab extension, node_modules, SkyPilot's venv),
# each under a key that is a digest of everything it is built from. Other inputs make another
# key, so a stale copy is never used. The folder is ${XDG_CACHE_HOME:-~/.cache}/jupyter-dist
# (beside Horovod's wheels, scripts/build-horovod.sh); delete it to build everything again.
#   key=$(cache_key FILE...)            the digest of the files' names and contents, and node's version
#   cache_restore NAME KEY DEST         copy the cached NAME/KEY to DEST; fails when there is none
#   cache_save NAME KEY SRC             copy SRC into the cache as NAME/KEY, unless it is there
#   cache_path NAME KEY                 where NAME/KEY is (or would be)

machine_cache=${XDG_CACHE_HOME:-$HOME/.cache}/jupyter-dist

cache_key() {
    {
        node --version 2>/dev/null || echo "no node"
        local file
        for file in "$@"; do
            echo "$file"
            cat "$file"
        done
    } | sha256sum | cut -c1-16
}

cache_path() {
    echo "$machine_cache/$1/$2"
}

cache_restore() {
    local cached
    cached=$(cache_path "$1" "$2")
    [[ -d "$cached" ]] || return 1
    rm -rf "$3"
    # A copy, not links: whatever writes into the clone's folder never changes the cache.
    # Its times are now's, not the cache's: a copy older than the clone's sources would be
    # taken as stale, and built again (hatch-jupyter-builder compares them).
    cp -R --preserve=mode,links "$cached" "$3"
}

cache_save() {
    local cached partial
    cached=$(cache_path "$1" "$2")
    [[ -d "$cached" ]] && return 0
    mkdir -p "$(dirname "$cached")"
    # Copied beside it, then renamed: a copy cut short is never taken for a whole one.
    partial=$(mktemp -d "$cached.partial.XXXXXX")
    cp -a "$3/." "$partial/"
    chmod 755 "$partial"
    mv -T "$partial" "$cached" 2>/dev/null || rm -rf "$partial"  # another run saved it first
}
