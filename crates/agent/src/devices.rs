//! Which GPUs' device nodes an attempt may open.
//!
//! The problem: `CUDA_VISIBLE_DEVICES` is a request, not a fence. A bare
//! job is a process on the node, and `/dev/nvidia0..N` are there for it
//! to open: another tenant's job could use (or read the memory of) GPUs
//! that are not its own.
//!
//! So each attempt's cgroup gets a device program, as runc gives a
//! container on cgroup v2 and Slurm's `ConstrainDevices` gives a job: an
//! eBPF program of type `BPF_PROG_TYPE_CGROUP_DEVICE` attached to the
//! attempt's v2 group, which the kernel runs at every open of a device
//! node by any process of the group. It refuses (`EPERM`) the character
//! devices of the NVIDIA major whose minors are the node's other GPUs,
//! and lets everything else through, the driver's control nodes
//! (`nvidiactl`, `nvidia-uvm`, `nvidia-modeset`) included. It is attached
//! with `BPF_F_ALLOW_MULTI`, so that an OCI runtime may attach its own
//! below it (a container's group is a child of the attempt's), and both
//! must allow. The program goes with its [`Filter`]: a group used again
//! by the next attempt gets that attempt's. The v2 hierarchy has the
//! program hook on unified and hybrid hosts alike.
//!
//! Loading a program runs the kernel's verifier, a fifth of a short
//! job's agent time: a node has few sets of other GPUs (one per GPU for
//! single-GPU jobs), so [`Programs`] loads each once and attaches it
//! again and again.

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The NVIDIA driver's character device major (`/dev/nvidiaN` is
/// `195:N`; its control nodes are 195:254 and 195:255).
pub const NVIDIA_MAJOR: u32 = 195;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_ATTACH: libc::c_long = 8;
const BPF_PROG_DETACH: libc::c_long = 9;
const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;
const BPF_F_ALLOW_MULTI: u32 = 2;
const BPF_DEVCG_DEV_CHAR: i32 = 2;

/// A device program attached to a group; detached when dropped.
#[derive(Debug)]
pub struct Filter {
    group: OwnedFd,
    program: Arc<OwnedFd>,
}

/// The programs loaded so far, by the minors they refuse.
#[derive(Debug, Default)]
pub struct Programs {
    loaded: Mutex<HashMap<Vec<u32>, Arc<OwnedFd>>>,
}

impl Programs {
    /// Attaches to the v2 group at `group` the program that refuses the
    /// NVIDIA devices of minors `denied`, loaded once.
    pub fn attach(&self, group: &Path, denied: &[u32]) -> std::io::Result<Filter> {
        let program = {
            let mut loaded = self.loaded.lock().expect("device programs");
            match loaded.get(denied) {
                Some(program) => program.clone(),
                None => {
                    let program = Arc::new(load(&program(denied))?);
                    loaded.insert(denied.to_vec(), program.clone());
                    program
                }
            }
        };
        attach_program(group, program)
    }
}

impl Drop for Filter {
    fn drop(&mut self) {
        let _ = prog_attach(BPF_PROG_DETACH, &self.group, &self.program, 0);
    }
}

fn attach_program(group: &Path, program: Arc<OwnedFd>) -> std::io::Result<Filter> {
    let path = CString::new(group.as_os_str().as_encoded_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: a NUL-terminated path; the descriptor is owned below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    let group = unsafe { OwnedFd::from_raw_fd(fd) };
    prog_attach(BPF_PROG_ATTACH, &group, &program, BPF_F_ALLOW_MULTI)?;
    Ok(Filter { group, program })
}

/// The minors of `node_minors` (each GPU's, by index) that an attempt on
/// the GPUs `own` (indices) must not open.
pub fn denied(node_minors: &[u32], own: &[u8]) -> Vec<u32> {
    node_minors
        .iter()
        .enumerate()
        .filter(|(index, _)| !own.iter().any(|o| usize::from(*o) == *index))
        .map(|(_, minor)| *minor)
        .collect()
}

/// One instruction: opcode, registers, offset, immediate.
fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    u64::from(code)
        | (u64::from(dst & 0xf) << 8)
        | (u64::from(src & 0xf) << 12)
        | (u64::from(off as u16) << 16)
        | (u64::from(imm as u32) << 32)
}

/// The program: `r1` is `struct bpf_cgroup_dev_ctx { u32 access_type;
/// u32 major; u32 minor; }`, the type in access_type's low 16 bits;
/// `r0 = 0` refuses.
pub fn program(denied: &[u32]) -> Vec<u64> {
    const LDX_W: u8 = 0x61; // r_dst = *(u32 *)(r_src + off)
    const AND_K: u8 = 0x57; // r_dst &= imm (64-bit)
    const JNE_K: u8 = 0x55; // if r_dst != imm goto +off
    const JEQ_K: u8 = 0x15; // if r_dst == imm goto +off
    const MOV_K: u8 = 0xb7; // r_dst = imm
    const EXIT: u8 = 0x95;
    let n = denied.len() as i16;
    let mut p = vec![
        insn(LDX_W, 2, 1, 0, 0),
        insn(AND_K, 2, 0, 0, 0xffff),
        insn(LDX_W, 3, 1, 4, 0),
        insn(LDX_W, 4, 1, 8, 0),
        // Not a character device, or not the NVIDIA major: allowed.
        insn(JNE_K, 2, 0, n + 1, BPF_DEVCG_DEV_CHAR),
        insn(JNE_K, 3, 0, n, NVIDIA_MAJOR as i32),
    ];
    for (i, minor) in denied.iter().enumerate() {
        // To the refusal, past the rest of the minors and the allow.
        p.push(insn(JEQ_K, 4, 0, n - i as i16 + 1, *minor as i32));
    }
    p.extend([
        insn(MOV_K, 0, 0, 0, 1),
        insn(EXIT, 0, 0, 0, 0),
        insn(MOV_K, 0, 0, 0, 0),
        insn(EXIT, 0, 0, 0, 0),
    ]);
    p
}

fn load(program: &[u64]) -> std::io::Result<OwnedFd> {
    let license = c"Apache-2.0";
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&BPF_PROG_TYPE_CGROUP_DEVICE.to_ne_bytes());
    attr[4..8].copy_from_slice(&(program.len() as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(program.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    // SAFETY: `attr` is a `union bpf_attr` for BPF_PROG_LOAD whose pointers
    // (the instructions, the license) outlive the call.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_PROG_LOAD, attr.as_ptr(), attr.len()) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn prog_attach(command: libc::c_long, group: &OwnedFd, program: &OwnedFd, flags: u32) -> std::io::Result<()> {
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&(group.as_raw_fd() as u32).to_ne_bytes());
    attr[4..8].copy_from_slice(&(program.as_raw_fd() as u32).to_ne_bytes());
    attr[8..12].copy_from_slice(&BPF_CGROUP_DEVICE.to_ne_bytes());
    attr[12..16].copy_from_slice(&flags.to_ne_bytes());
    // SAFETY: `attr` is a `union bpf_attr` for BPF_PROG_(DE)ATTACH.
    let done = unsafe { libc::syscall(libc::SYS_bpf, command, attr.as_ptr(), attr.len()) };
    match done {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_attempt_is_denied_the_node_gpus_not_its_own() {
        assert_eq!(denied(&[0, 1, 2, 3], &[1, 2]), [0, 3]);
        assert_eq!(denied(&[4, 5], &[0, 1]), Vec::<u32>::new());
        assert_eq!(denied(&[0, 1], &[]), [0, 1]);
        // Each refusal jumps past the rest to `r0 = 0`.
        let p = program(&[0, 3]);
        assert_eq!(p.len(), 6 + 2 + 4);
        let off = |i: usize| (p[i] >> 16) as u16 as i16;
        assert_eq!((off(4), off(5)), (3, 2), "the checks of type and major go to the allow");
        assert_eq!((off(6), off(7)), (3, 2), "each minor goes to the refusal");
    }
}
