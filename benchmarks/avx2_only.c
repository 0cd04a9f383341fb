// The CPU as an AVX2-only machine sees it, for the peers' libraries: loaded with LD_PRELOAD by
// `python -m benchmarks.avx2_only`, which has replaced each `cpuid` instruction (0f a2) in
// copies of those libraries by `ud0` (0f ff), an undefined opcode compilers never emit (the
// tool checks): executing one raises SIGILL. This handler runs the real `cpuid` for the
// same leaf and subleaf, clears the AVX-512, AVX10 and AMX feature bits of leaf 7, and
// resumes 2 bytes on. Any other SIGILL (a real trap, a signal sent) goes to the handler
// the program installed (this library keeps itself first: it wraps `sigaction` and
// `signal`, so Python's faulthandler, which pytest enables, still sees real traps), else
// gets the default action.
#define _GNU_SOURCE
#include <cpuid.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

// Leaf 7 subleaf 0. EBX: AVX512F 16, DQ 17, IFMA 21, PF 26, ER 27, CD 28, BW 30, VL 31.
#define EBX_AVX512 ((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | \
                    (1u << 28) | (1u << 30) | (1u << 31))
// ECX: VBMI 1, VBMI2 6, VNNI 11, BITALG 12, VPOPCNTDQ 14.
#define ECX_AVX512 ((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14))
// EDX: 4VNNIW 2, 4FMAPS 3, VP2INTERSECT 8, AMX-BF16 22, FP16 23, AMX-TILE 24, AMX-INT8 25.
#define EDX_AVX512 ((1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | \
                    (1u << 24) | (1u << 25))
// Leaf 7 subleaf 1. EAX: AVX512_BF16 5, AMX-FP16 21. EDX: AMX-COMPLEX 8, AVX10 19.
#define EAX1_AVX512 ((1u << 5) | (1u << 21))
#define EDX1_AVX512 ((1u << 8) | (1u << 19))

static const char* patched_dir;  // ANYSHAPE_AVX2_PATCHED: the folder of the patched copies
static size_t patched_len;
static volatile long masked_calls;
static struct sigaction program_handler;  // what the program asked for SIGILL (default: SIG_DFL)
static int (*real_sigaction)(int, const struct sigaction*, struct sigaction*);

// How many patched cpuid instructions ran (read with ctypes by the benchmark's report).
long anyshape_avx2_cpuid_calls(void) { return masked_calls; }

static void on_sigill(int sig, siginfo_t* info, void* context) {
  ucontext_t* uc = (ucontext_t*)context;
  greg_t* r = uc->uc_mcontext.gregs;
  const unsigned char* ip = (const unsigned char*)r[REG_RIP];
  Dl_info where;
  if (patched_dir && info->si_code > 0 && ip[0] == 0x0f && ip[1] == 0xff && dladdr(ip, &where) &&
      where.dli_fname && strncmp(where.dli_fname, patched_dir, patched_len) == 0) {
    const unsigned leaf = (unsigned)r[REG_RAX], subleaf = (unsigned)r[REG_RCX];
    unsigned a, b, c, d;
    __cpuid_count(leaf, subleaf, a, b, c, d);
    if (leaf == 7 && subleaf == 0) {
      b &= ~EBX_AVX512;
      c &= ~ECX_AVX512;
      d &= ~EDX_AVX512;
    } else if (leaf == 7 && subleaf == 1) {
      a &= ~EAX1_AVX512;
      d &= ~EDX1_AVX512;
    } else if (leaf == 0x24) {  // the AVX10 leaf, reported only with the AVX10 bit
      a = b = c = d = 0;
    }
    r[REG_RAX] = a;  // (cpuid writes the four registers zero-extended)
    r[REG_RBX] = b;
    r[REG_RCX] = c;
    r[REG_RDX] = d;
    r[REG_RIP] += 2;
    __atomic_add_fetch(&masked_calls, 1, __ATOMIC_RELAXED);
    return;
  }
  // Not ours: the program's handler; else a real trap gets the default action (the
  // instruction runs again and traps as it would have), a signal sent is raised again
  // under it, or dropped when the program ignores SIGILL.
  const struct sigaction h = program_handler;
  if (h.sa_handler == SIG_IGN && info->si_code <= 0) return;
  if (h.sa_handler != SIG_DFL && h.sa_handler != SIG_IGN) {
    if (h.sa_flags & SA_SIGINFO)
      h.sa_sigaction(sig, info, context);
    else
      h.sa_handler(sig);
    return;
  }
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  real_sigaction(SIGILL, &dfl, NULL);
  if (info->si_code <= 0) raise(SIGILL);
}

static void find_real_sigaction(void) {
  if (!real_sigaction)
    real_sigaction = (int (*)(int, const struct sigaction*, struct sigaction*))dlsym(RTLD_NEXT, "sigaction");
}

// The program's SIGILL handler is recorded, and served from on_sigill, instead of
// replacing it.
int sigaction(int signum, const struct sigaction* act, struct sigaction* oldact) {
  find_real_sigaction();
  if (signum != SIGILL || !patched_dir) return real_sigaction(signum, act, oldact);
  const struct sigaction asked = act ? *act : program_handler;  // (act may be oldact)
  if (oldact) *oldact = program_handler;
  program_handler = asked;
  return 0;
}

// signal() and its variants reach glibc's sigaction internally: recorded the same way.
static sighandler_t record_handler(int signum, sighandler_t handler, int flags) {
  find_real_sigaction();
  struct sigaction act, old;
  memset(&act, 0, sizeof act);
  act.sa_handler = handler;
  act.sa_flags = flags;
  sigemptyset(&act.sa_mask);
  if (signum == SIGILL && patched_dir) {
    old = program_handler;
    program_handler = act;
    return (old.sa_flags & SA_SIGINFO) ? (sighandler_t)old.sa_sigaction : old.sa_handler;
  }
  return real_sigaction(signum, &act, &old) == 0 ? old.sa_handler : SIG_ERR;
}
sighandler_t signal(int signum, sighandler_t handler) { return record_handler(signum, handler, SA_RESTART); }
sighandler_t bsd_signal(int signum, sighandler_t handler) { return record_handler(signum, handler, SA_RESTART); }
sighandler_t sysv_signal(int signum, sighandler_t handler) {
  return record_handler(signum, handler, SA_RESETHAND | SA_NODEFER);
}

__attribute__((constructor)) static void install(void) {
  find_real_sigaction();
  program_handler.sa_handler = SIG_DFL;
  patched_dir = getenv("ANYSHAPE_AVX2_PATCHED");
  patched_len = patched_dir ? strlen(patched_dir) : 0;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigill;
  sa.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&sa.sa_mask);
  real_sigaction(SIGILL, &sa, NULL);
}
