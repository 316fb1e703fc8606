//! Giving memory back to the system when a session ends.
//!
//! A session's buffers and thread stacks are freed when it ends, but glibc
//! keeps freed heap memory in its arenas (one per thread, up to 8 per core)
//! for reuse. After a 1024-stream session that is a lot of resident memory
//! no one will use until the next big session; `malloc_trim` hands the free
//! pages back.

/// Returns freed heap memory to the system (glibc's `malloc_trim`).
pub fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}
