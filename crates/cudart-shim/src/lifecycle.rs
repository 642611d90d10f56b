//! The library's load-time constructor and its destructor: `.init_array` and
//! `.fini_array` entries, which must live in the cdylib itself (a `#[used]` static of an
//! rlib may be dropped by the linker). The constructor installs the engine's host
//! ([`crate::host`]) first, then lets the engine make the self-pipe and install the pause
//! and resume handlers; the destructor marks the process exiting
//! ([`cudaw_engine::lifecycle`] says what happens at load, exit and fork).

// SAFETY (of the attribute): a function pointer placed in `.init_array` is called by the
// dynamic loader with no arguments once the library is relocated; `on_load` takes none,
// never unwinds (its body runs inside the panic boundary) and touches nothing that needs
// `main` to have started.
#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

// SAFETY (of the attribute): as above, for `.fini_array`, run at exit (the library is
// never unloaded).
#[used]
#[link_section = ".fini_array"]
static ON_UNLOAD: extern "C" fn() = on_unload;

extern "C" fn on_load() {
    crate::boundary::guard("loading cudaw", (), || {
        crate::host::install();
        cudaw_engine::lifecycle::on_load();
    })
}

extern "C" fn on_unload() {
    crate::boundary::guard("unloading cudaw", (), cudaw_engine::lifecycle::on_unload)
}
