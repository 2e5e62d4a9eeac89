// The device images a program library embeds: one per kernel source, built for the library's
// arch before the binding is compiled (a compressed fatbin from nvcc, or a Triton cubin). The
// build lists their files in CAKE_IMAGES, as CAKE_IMAGE(<i>, "<file>") items for i = 0 .. n-1,
// and sets CAKE_IMAGE_COUNT n; the assembler copies the bytes in (.incbin), 64-byte aligned as
// cuLibraryLoadData wants them. Included by exactly one file of a library: its binding.
#pragma once

#if !defined(CAKE_IMAGE_COUNT) || !defined(CAKE_IMAGES)
#error "CAKE_IMAGE_COUNT and CAKE_IMAGES must be defined by the build (the device images)"
#endif

#define CAKE_IMAGE(index, file)                                                \
  __asm__(".section .rodata.cake_image_" #index ",\"a\",%progbits\n"           \
          ".balign 64\n"                                                       \
          ".globl cake_program_image_" #index "\n"                             \
          ".hidden cake_program_image_" #index "\n"                            \
          "cake_program_image_" #index ":\n"                                   \
          ".incbin \"" file "\"\n"                                             \
          ".byte 0\n"                                                          \
          ".previous\n");                                                      \
  extern "C" const unsigned char cake_program_image_##index[];
CAKE_IMAGES
#undef CAKE_IMAGE

extern "C" __attribute__((visibility("hidden"))) const int cake_program_image_count = CAKE_IMAGE_COUNT;
#define CAKE_IMAGE(index, file) cake_program_image_##index,
extern "C" __attribute__((visibility("hidden"))) const unsigned char* const cake_program_images[] = {
    CAKE_IMAGES nullptr};
#undef CAKE_IMAGE
