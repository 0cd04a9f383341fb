/* anyshape runtime: the fast-call extension as one translation unit, in build order.
 *
 * setup.py compiles this file into anyshape.runtime._anyshape_fastcall when the package
 * is installed; runtime/fastcall.py reads the same list to hash the sources (and to
 * build them on first use where the installed module is missing or stale). The plugin's
 * types use the helpers of fastcall.c, and the module definition registers those types.
 */
#include "fastcall.c"
#include "../plugin/torchcall.c"
#include "../plugin/modulecall.c"
#include "fastcall_module.c"
