// The device images a program library embeds: one per kernel source, built for the library's
// arch before the binding is compiled (a compressed fatbin from nvcc, or a Triton cubin). The
// build names their files with CAKE_IMAGE_0 .. CAKE_IMAGE_<n-1> (string literals) and
// CAKE_IMAGE_COUNT n; the assembler copies the bytes in (.incbin), 64-byte aligned as
// cuLibraryLoadData wants them. Included by exactly one file of a library: its binding.
#pragma once

#ifndef CAKE_IMAGE_COUNT
#error "CAKE_IMAGE_COUNT and CAKE_IMAGE_<i> must be defined by the build (the device images)"
#endif

#define CAKE_IMAGE_EMBED_(index, file)                                         \
  __asm__(".section .rodata.cake_image_" #index ",\"a\",%progbits\n"           \
          ".balign 64\n"                                                       \
          ".globl cake_program_image_" #index "\n"                             \
          ".hidden cake_program_image_" #index "\n"                            \
          "cake_program_image_" #index ":\n"                                   \
          ".incbin \"" file "\"\n"                                             \
          ".byte 0\n"                                                          \
          ".previous\n");                                                      \
  extern "C" const unsigned char cake_program_image_##index[];

#if CAKE_IMAGE_COUNT > 0
CAKE_IMAGE_EMBED_(0, CAKE_IMAGE_0)
#endif
#if CAKE_IMAGE_COUNT > 1
CAKE_IMAGE_EMBED_(1, CAKE_IMAGE_1)
#endif
#if CAKE_IMAGE_COUNT > 2
CAKE_IMAGE_EMBED_(2, CAKE_IMAGE_2)
#endif
#if CAKE_IMAGE_COUNT > 3
CAKE_IMAGE_EMBED_(3, CAKE_IMAGE_3)
#endif
#if CAKE_IMAGE_COUNT > 4
CAKE_IMAGE_EMBED_(4, CAKE_IMAGE_4)
#endif
#if CAKE_IMAGE_COUNT > 5
CAKE_IMAGE_EMBED_(5, CAKE_IMAGE_5)
#endif
#if CAKE_IMAGE_COUNT > 6
CAKE_IMAGE_EMBED_(6, CAKE_IMAGE_6)
#endif
#if CAKE_IMAGE_COUNT > 7
CAKE_IMAGE_EMBED_(7, CAKE_IMAGE_7)
#endif
#if CAKE_IMAGE_COUNT > 8
#error "a program embeds at most 8 images"
#endif

extern "C" __attribute__((visibility("hidden"))) const int cake_program_image_count = CAKE_IMAGE_COUNT;
extern "C" __attribute__((visibility("hidden"))) const unsigned char* const cake_program_images[] = {
#if CAKE_IMAGE_COUNT > 0
    cake_program_image_0,
#endif
#if CAKE_IMAGE_COUNT > 1
    cake_program_image_1,
#endif
#if CAKE_IMAGE_COUNT > 2
    cake_program_image_2,
#endif
#if CAKE_IMAGE_COUNT > 3
    cake_program_image_3,
#endif
#if CAKE_IMAGE_COUNT > 4
    cake_program_image_4,
#endif
#if CAKE_IMAGE_COUNT > 5
    cake_program_image_5,
#endif
#if CAKE_IMAGE_COUNT > 6
    cake_program_image_6,
#endif
#if CAKE_IMAGE_COUNT > 7
    cake_program_image_7,
#endif
    nullptr};
