/* The operator's page (src/ops/admin_page.html), compiled into the binary as it is, so the
 * admin listener serves it without files or a build step. */
__asm__(".section .rodata\n"
        ".global admin_page_html\n"
        ".type admin_page_html, @object\n"
        "admin_page_html:\n"
        ".incbin \"src/ops/admin_page.html\"\n"
        ".byte 0\n"
        ".size admin_page_html, . - admin_page_html\n"
        ".previous\n");
